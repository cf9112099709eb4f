package validate

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// modulePath is the import path prefix of this repository.
const modulePath = "github.com/grasp-sync/grasp-sync/"

// Family is one kind of name bus.Names derives: a subject family (with its
// publish method XSubject, its wildcard XSubjects and, when it is a stream,
// XStream) or a KV bucket (XBucket). Families are found by reflection on
// bus.Names, so a name another engineer adds is picked up without editing
// this package.
type Family struct {
	Name     string // e.g. "FetchCmd", "RepoIndex"
	Bucket   bool
	Wildcard string // subject wildcard (subject families)
	Stream   string // stream name, "" for a plain subject family
	BucketID string // bucket name (buckets)
	// Sample is one concrete subject of the family, for tests; "" for a
	// subscribe-only wildcard (AllSubjects).
	Sample string
}

// Families enumerates the methods of bus.Names for one prefix.
func Families(n bus.Names) (map[string]*Family, error) {
	v := reflect.ValueOf(n)
	t := v.Type()
	out := map[string]*Family{}
	get := func(name string) *Family {
		if out[name] == nil {
			out[name] = &Family{Name: name}
		}
		return out[name]
	}
	for i := range t.NumMethod() {
		m := t.Method(i)
		call := func() string { return callWithSamples(v.Method(i), "") }
		switch {
		case strings.HasSuffix(m.Name, "Bucket"):
			f := get(strings.TrimSuffix(m.Name, "Bucket"))
			f.Bucket, f.BucketID = true, call()
		case strings.HasSuffix(m.Name, "Stream"):
			get(strings.TrimSuffix(m.Name, "Stream")).Stream = call()
		case strings.HasSuffix(m.Name, "Subjects"):
			get(strings.TrimSuffix(m.Name, "Subjects")).Wildcard = call()
		case strings.HasSuffix(m.Name, "Subject"):
			get(strings.TrimSuffix(m.Name, "Subject")).Sample = callWithSamples(v.Method(i), "x")
		case strings.HasSuffix(m.Name, "Queue"):
			// A queue group name: the permission is the subscription's
			// subject (the allow lists name no queue groups).
		default:
			return nil, fmt.Errorf("bus.Names.%s is neither a Subject, Subjects, Stream, Bucket nor Queue method: teach deploy/validate what permission it needs", m.Name)
		}
	}
	for name, f := range out {
		// A wildcard without a single subject (AllSubjects) is only ever
		// subscribed to; a single subject needs its wildcard.
		if !f.Bucket && f.Wildcard == "" {
			return nil, fmt.Errorf("subject family %s needs %sSubjects in bus.Names", name, name)
		}
	}
	return out, nil
}

// callWithSamples calls a Names method with 1 for int parameters and s for
// string ones ("" gives the widest wildcard of a XSubjects method).
func callWithSamples(m reflect.Value, s string) string {
	var args []reflect.Value
	for i := range m.Type().NumIn() {
		switch m.Type().In(i).Kind() {
		case reflect.Int:
			args = append(args, reflect.ValueOf(1))
		case reflect.String:
			args = append(args, reflect.ValueOf(s))
		default:
			panic(fmt.Sprintf("bus.Names method with a %s parameter", m.Type().In(i)))
		}
	}
	return m.Call(args)[0].String()
}

// Usage is what one service's code does with the families of bus.Names,
// read from its source (and the repository packages it imports).
type Usage struct {
	// Publish: families with an XSubject reference outside a consumer or
	// stream definition (the service sends on them).
	Publish map[string]bool
	// Subscribe: families whose XSubjects wildcard is used outside a
	// consumer or stream definition (a core NATS subscription).
	Subscribe map[string]bool
	// Streams: families whose XStream the service names (it consumes from,
	// reads or maintains that stream).
	Streams map[string]bool
	// Buckets: KV buckets the service opens.
	Buckets map[string]bool
	// ReadStreams and ReadBuckets: streams and buckets named only by
	// read-only code (readOnlyDir), which inspects them and never writes.
	ReadStreams, ReadBuckets map[string]bool
}

func newUsage() Usage {
	return Usage{Publish: map[string]bool{}, Subscribe: map[string]bool{}, Streams: map[string]bool{},
		Buckets: map[string]bool{}, ReadStreams: map[string]bool{}, ReadBuckets: map[string]bool{}}
}

// readOnlyDir says whether the code in dir only reads the streams and
// buckets it names: pkg/syncstatus (the status of a running sync, which the
// relay's status page and graspctl show) and graspctl, which inspects and
// never changes anything. Their users get read rights on what they name
// (info, gets, ephemeral ordered consumers), not writes, purges or acks.
func readOnlyDir(dir string) bool {
	dir = filepath.ToSlash(dir)
	return dir == "pkg/syncstatus" || dir == "services/graspctl" || strings.HasPrefix(dir, "services/graspctl/")
}

// ScanUsage reads the non-test Go files of services/<name> and of every
// repository package they import (transitively; pkg/bus itself and test
// helpers excluded) and records which bus.Names methods they call and how.
func ScanUsage(repoRoot, name string, fams map[string]*Family) (Usage, error) {
	u := newUsage()
	methods := map[string]string{} // method name → family
	for f := range fams {
		for _, suffix := range []string{"Subject", "Subjects", "Stream", "Bucket"} {
			methods[f+suffix] = f
		}
	}
	seen := map[string]bool{}
	queue := []string{filepath.Join("services", name)}
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		if seen[dir] {
			continue
		}
		seen[dir] = true
		imports, err := scanDir(filepath.Join(repoRoot, dir), methods, &u, readOnlyDir(dir))
		if err != nil {
			return u, err
		}
		for _, imp := range imports {
			rel, ok := strings.CutPrefix(imp, modulePath)
			if !ok || rel == "pkg/bus" || rel == "pkg/testkit" || strings.HasPrefix(rel, "proto") {
				continue
			}
			queue = append(queue, rel)
		}
		// The binary and any sub-package of the service module.
		if strings.HasPrefix(dir, "services/") {
			entries, _ := os.ReadDir(filepath.Join(repoRoot, dir))
			for _, e := range entries {
				if e.IsDir() && e.Name() != "testdata" {
					queue = append(queue, filepath.Join(dir, e.Name()))
				}
			}
		}
	}
	return u, nil
}

func scanDir(dir string, methods map[string]string, u *Usage, readOnly bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", dir, err)
	}
	var imports []string
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", e.Name(), err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			imports = append(imports, p)
		}
		// Ranges of consumer and stream definitions: a subject named there
		// is a filter or a stream's subject list, not something sent.
		type span struct{ from, to token.Pos }
		var defs []span
		ast.Inspect(f, func(n ast.Node) bool {
			if cl, ok := n.(*ast.CompositeLit); ok {
				switch typeName(cl.Type) {
				case "ConsumerConfig", "OrderedConsumerConfig", "StreamConfig", "ConsumeConfig":
					defs = append(defs, span{cl.Pos(), cl.End()})
				}
			}
			if call, ok := n.(*ast.CallExpr); ok {
				// jetstream.WithPurgeSubject(…) and similar stream-maintenance
				// options name subjects the caller does not send on.
				if strings.HasPrefix(typeName(call.Fun), "With") {
					defs = append(defs, span{call.Pos(), call.End()})
				}
			}
			return true
		})
		inDef := func(p token.Pos) bool {
			for _, s := range defs {
				if p >= s.from && p < s.to {
					return true
				}
			}
			return false
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			fam, ok := methods[sel.Sel.Name]
			if !ok {
				return true
			}
			switch strings.TrimPrefix(sel.Sel.Name, fam) {
			case "Stream":
				if readOnly {
					u.ReadStreams[fam] = true
				} else {
					u.Streams[fam] = true
				}
			case "Bucket":
				if readOnly {
					u.ReadBuckets[fam] = true
				} else {
					u.Buckets[fam] = true
				}
			case "Subject":
				if !inDef(sel.Pos()) {
					u.Publish[fam] = true
				}
			case "Subjects":
				if !inDef(sel.Pos()) {
					u.Subscribe[fam] = true
				}
			}
			return true
		})
	}
	return imports, nil
}

// typeName is the last identifier of a type or function expression.
func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return x.Sel.Name
	}
	return ""
}

// SetupFamilies are the streams and buckets bus.Setup creates or updates:
// every service calls it at start (pkg/service.Main), so every service may
// create and update them.
func SetupFamilies(repoRoot string, fams map[string]*Family) (Usage, error) {
	methods := map[string]string{}
	for f := range fams {
		methods[f+"Stream"] = f
		methods[f+"Bucket"] = f
	}
	u := newUsage()
	_, err := scanDir(filepath.Join(repoRoot, "pkg", "bus"), methods, &u, false)
	return u, err
}

// Permissions are one NATS user's allowed publish and subscribe subjects.
type Permissions struct {
	Publish   []string
	Subscribe []string
}

// Derive turns a service's usage into NATS permissions. setup adds the
// create/update rights bus.Setup needs (nil for graspctl, which never
// creates anything).
//
// Using a stream or bucket includes creating and updating it
// ($JS.API.STREAM.CREATE/UPDATE): a service that opens a bucket it owns
// (the fetcher's FetcherLeaseBucket, FetcherRelayBucket) creates it with
// bus.EnsureKeyValue, and nats.go's CreateOrUpdate asks STREAM.UPDATE first
// and STREAM.CREATE only when the stream does not exist yet; the update is
// what applies a changed configuration (a lease TTL) at the next start.
func Derive(fams map[string]*Family, u Usage, setup *Usage) Permissions {
	pub, sub := map[string]bool{}, map[string]bool{"_INBOX.>": true}
	// Account info: jetstream.New and KV creation ask for limits.
	pub["$JS.API.INFO"] = true
	manage := func(stream string) {
		for _, op := range []string{"CREATE", "UPDATE", "INFO"} {
			pub["$JS.API.STREAM."+op+"."+stream] = true
		}
	}
	// read: what inspecting a stream or bucket takes — its info, a message
	// by sequence or subject, and an ephemeral ordered consumer (created,
	// pulled from with flow control, deleted when done; KV key listings and
	// watches are such consumers). No acks, purges, deletes or KV writes.
	read := func(stream string) {
		pub["$JS.API.STREAM.INFO."+stream] = true
		pub["$JS.API.STREAM.MSG.GET."+stream] = true
		pub["$JS.API.DIRECT.GET."+stream] = true
		pub["$JS.API.DIRECT.GET."+stream+".>"] = true
		pub["$JS.API.CONSUMER.CREATE."+stream+".>"] = true
		pub["$JS.API.CONSUMER.INFO."+stream+".>"] = true
		pub["$JS.API.CONSUMER.DELETE."+stream+".>"] = true
		pub["$JS.API.CONSUMER.MSG.NEXT."+stream+".>"] = true
		pub["$JS.FC."+stream+".>"] = true
	}
	use := func(stream string) {
		manage(stream)
		pub["$JS.API.STREAM.MSG.GET."+stream] = true
		pub["$JS.API.STREAM.MSG.DELETE."+stream] = true
		pub["$JS.API.STREAM.PURGE."+stream] = true
		pub["$JS.API.DIRECT.GET."+stream] = true
		pub["$JS.API.DIRECT.GET."+stream+".>"] = true
		pub["$JS.API.CONSUMER.CREATE."+stream+".>"] = true
		pub["$JS.API.CONSUMER.DURABLE.CREATE."+stream+".>"] = true
		pub["$JS.API.CONSUMER.INFO."+stream+".>"] = true
		pub["$JS.API.CONSUMER.DELETE."+stream+".>"] = true
		pub["$JS.API.CONSUMER.MSG.NEXT."+stream+".>"] = true
		pub["$JS.ACK."+stream+".>"] = true
		pub["$JS.FC."+stream+".>"] = true
	}
	if setup != nil {
		for f := range setup.Streams {
			manage(fams[f].Stream)
		}
		for f := range setup.Buckets {
			manage("KV_" + fams[f].BucketID)
		}
	}
	for f := range u.Streams {
		use(fams[f].Stream)
	}
	for f := range u.ReadStreams {
		read(fams[f].Stream)
	}
	for f := range u.ReadBuckets {
		read("KV_" + fams[f].BucketID)
	}
	for f := range u.Buckets {
		use("KV_" + fams[f].BucketID)
		pub["$KV."+fams[f].BucketID+".>"] = true
	}
	for f := range u.Publish {
		pub[fams[f].Wildcard] = true
	}
	for f := range u.Subscribe {
		sub[fams[f].Wildcard] = true
	}
	return Permissions{Publish: sorted(pub), Subscribe: sorted(sub)}
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Users are the NATS users of a deployment, one per service plus graspctl.
var Users = append(append([]string{}, Services...), "graspctl")

// AccountName is the NATS account all grasp-sync users share (KEDA's
// nats-jetstream trigger names it too).
const AccountName = "GRASP"

// DerivePermissions computes every user's permissions from the code.
func DerivePermissions(repoRoot string, n bus.Names) (map[string]Permissions, map[string]Usage, error) {
	fams, err := Families(n)
	if err != nil {
		return nil, nil, err
	}
	setup, err := SetupFamilies(repoRoot, fams)
	if err != nil {
		return nil, nil, err
	}
	perms, usages := map[string]Permissions{}, map[string]Usage{}
	for _, user := range Users {
		u, err := ScanUsage(repoRoot, user, fams)
		if err != nil {
			return nil, nil, err
		}
		usages[user] = u
		if user == "graspctl" {
			perms[user] = Derive(fams, u, nil)
		} else {
			perms[user] = Derive(fams, u, &setup)
		}
	}
	return perms, usages, nil
}

// AuthConf renders the accounts block of nats.conf: one account, one user
// per service with its password from the environment of the NATS container
// ($<USER>_PASSWORD, from the Secret grasp-nats-users).
func AuthConf(perms map[string]Permissions) string {
	var b strings.Builder
	b.WriteString("# GENERATED by deploy/validate from the code's use of bus.Names — do not edit.\n")
	b.WriteString("# Regenerate: cd deploy/validate && go test -run TestNATSAuthConf -update\n")
	b.WriteString("accounts {\n  " + AccountName + " {\n    jetstream: enabled\n    users: [\n")
	for _, user := range Users {
		p := perms[user]
		fmt.Fprintf(&b, "      {\n        user: %s\n        password: $%s_PASSWORD\n        permissions: {\n", user, strings.ToUpper(user))
		writeList(&b, "publish", p.Publish)
		writeList(&b, "subscribe", p.Subscribe)
		b.WriteString("        }\n      }\n")
	}
	b.WriteString("    ]\n  }\n}\n")
	return b.String()
}

func writeList(b *strings.Builder, what string, subjects []string) {
	fmt.Fprintf(b, "          %s: { allow: [\n", what)
	for _, s := range subjects {
		fmt.Fprintf(b, "            %q\n", s)
	}
	b.WriteString("          ] }\n")
}
