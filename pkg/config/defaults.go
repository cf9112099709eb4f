package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// FillDefaults sets every field of the struct spec points to that is zero,
// or negative, to its `default` tag: the one place a default is written, so
// a Config built in code (tests, graspd) behaves like one read from the
// environment. Embedded and nested structs are filled too. Strings, signed
// and unsigned integers, floats, durations, string slices (comma
// separated) and byte sizes (ByteSize: "8MiB") are supported; a bool
// default cannot be told from an unset false and is refused, as is a tag that does not parse: both are
// programming errors, so FillDefaults panics on them.
//
// A field tagged `zero:"off"` is left alone: in a Config built in code its
// zero value means "off" or "none" (no resync, no exempt addresses), which
// the environment cannot express but tests and graspd rely on.
func FillDefaults(spec any) {
	v := reflect.ValueOf(spec)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("config.FillDefaults: want a pointer to a struct, got %T", spec))
	}
	fillStruct(v.Elem())
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	byteSizeType = reflect.TypeOf(ByteSize(0))
)

func fillStruct(v reflect.Value) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		if fv.Kind() == reflect.Struct {
			fillStruct(fv)
			continue
		}
		def, ok := f.Tag.Lookup("default")
		if !ok || f.Tag.Get("zero") == "off" {
			continue
		}
		if err := fillField(fv, def); err != nil {
			panic(fmt.Sprintf("config.FillDefaults: %s.%s default %q: %v", t.Name(), f.Name, def, err))
		}
	}
}

func fillField(v reflect.Value, def string) error {
	switch {
	case v.Type() == durationType:
		if v.Int() > 0 {
			return nil
		}
		d, err := time.ParseDuration(def)
		if err != nil {
			return err
		}
		v.SetInt(int64(d))
	case v.Type() == byteSizeType:
		if v.Int() > 0 {
			return nil
		}
		b, err := ParseByteSize(def)
		if err != nil {
			return err
		}
		v.SetInt(int64(b))
	case v.Kind() == reflect.String:
		if v.String() == "" {
			v.SetString(def)
		}
	case v.CanInt():
		if v.Int() > 0 {
			return nil
		}
		n, err := strconv.ParseInt(def, 0, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetInt(n)
	case v.CanUint():
		if v.Uint() > 0 {
			return nil
		}
		n, err := strconv.ParseUint(def, 0, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetUint(n)
	case v.CanFloat():
		if v.Float() > 0 {
			return nil
		}
		x, err := strconv.ParseFloat(def, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetFloat(x)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		if v.Len() > 0 || def == "" {
			return nil
		}
		v.Set(reflect.ValueOf(strings.Split(def, ",")).Convert(v.Type()))
	default:
		return fmt.Errorf("unsupported field type %s", v.Type())
	}
	return nil
}
