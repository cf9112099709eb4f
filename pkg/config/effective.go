package config

import (
	"fmt"
	"net/url"
	"reflect"
	"strings"
)

// isSecret reports whether a field name says it holds a secret. "Key" alone
// is not enough: lease keys and key counts are not secrets.
func isSecret(field string) bool {
	lower := strings.ToLower(field)
	for _, word := range []string{"secret", "password", "token", "credential"} {
		if strings.Contains(lower, word) {
			return true
		}
	}
	for _, suffix := range []string{"authkey", "privatekey", "secretkey", "nsec"} {
		if strings.HasSuffix(lower, suffix) {
			return true
		}
	}
	return false
}

// Effective returns the values a loaded configuration struct holds, keyed by
// variable name (GRASP_…), with secrets masked: fields whose name says so
// (isSecret), and passwords inside URLs. Services log it at
// start so an operator sees what is in force.
func Effective(spec any) map[string]string {
	out := map[string]string{}
	walk(reflect.ValueOf(spec), out)
	return out
}

func walk(v reflect.Value, out map[string]string) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, ok := f.Tag.Lookup("envconfig")
		if !ok || name == "" {
			walk(v.Field(i), out)
			continue
		}
		out[Prefix+"_"+name] = mask(f.Name, v.Field(i))
	}
}

func mask(field string, v reflect.Value) string {
	s := fmt.Sprint(v.Interface())
	if v.Kind() == reflect.Slice {
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = fmt.Sprint(v.Index(i).Interface())
		}
		s = strings.Join(parts, ",")
	}
	if isSecret(field) && s != "" {
		return "***"
	}
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return s
}
