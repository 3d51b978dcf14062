package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// EnvPrefix starts every environment variable the binary reads.
const EnvPrefix = "FLYWHEEL_"

var defaultNote = regexp.MustCompile(` ?\(default [^)]*\)`)

// ConfigFileFlag names the optional YAML file (also FLYWHEEL_CONFIG).
const ConfigFileFlag = "config"

// Bind registers a flag for every leaf field of cfg on fs, plus --config.
// Call Load after fs.Parse.
func Bind(fs *flag.FlagSet, cfg *Config) *string {
	path := fs.String(ConfigFileFlag, os.Getenv(EnvPrefix+"CONFIG"), "optional YAML config file (env FLYWHEEL_CONFIG)")
	for _, f := range fields(cfg) {
		// The flag package prints the current value as the default itself.
		help := defaultNote.ReplaceAllString(f.help, "")
		fs.Var(f, f.flag, fmt.Sprintf("%s (env %s)", help, f.env))
	}
	return path
}

// Load fills cfg from the YAML file at path (if any), then the environment,
// then the flags the user set on fs (already parsed), and validates it.
func Load(fs *flag.FlagSet, cfg *Config, path string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// Flag values were written into cfg during Parse; keep them, load the
	// lower-precedence sources underneath, then re-apply them.
	flagValues := map[string]string{}
	for _, f := range fields(cfg) {
		if set[f.flag] {
			flagValues[f.flag] = f.String()
		}
	}
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read config file: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("config file %s: %w", path, err)
		}
	}
	for _, f := range fields(cfg) {
		if v, ok := os.LookupEnv(f.env); ok {
			if err := f.Set(v); err != nil {
				return fmt.Errorf("%s=%q: %w", f.env, v, err)
			}
		}
	}
	for _, f := range fields(cfg) {
		if v, ok := flagValues[f.flag]; ok {
			if err := f.Set(v); err != nil {
				return fmt.Errorf("--%s=%q: %w", f.flag, v, err)
			}
		}
	}
	return cfg.Validate()
}

// field is one leaf of Config seen as a flag.Value.
type field struct {
	flag, env, help string
	v               reflect.Value
}

// fields walks cfg's exported leaves in declaration order.
func fields(cfg *Config) []*field {
	var out []*field
	var walk func(v reflect.Value, path []string)
	walk = func(v reflect.Value, path []string) {
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			sf := t.Field(i)
			name := strings.Split(sf.Tag.Get("yaml"), ",")[0]
			if name == "" || name == "-" {
				continue
			}
			p := append(append([]string{}, path...), name)
			if sf.Type.Kind() == reflect.Struct && sf.Type != reflect.TypeOf(time.Duration(0)) {
				walk(v.Field(i), p)
				continue
			}
			key := strings.Join(p, "_")
			out = append(out, &field{
				flag: strings.ReplaceAll(key, "_", "-"),
				env:  EnvPrefix + strings.ToUpper(key),
				help: sf.Tag.Get("help"),
				v:    v.Field(i),
			})
		}
	}
	walk(reflect.ValueOf(cfg).Elem(), nil)
	return out
}

func (f *field) String() string {
	if f == nil || !f.v.IsValid() {
		return ""
	}
	switch x := f.v.Interface().(type) {
	case []string:
		return strings.Join(x, ",")
	case map[string]float64:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + strconv.FormatFloat(x[k], 'g', -1, 64)
		}
		return strings.Join(parts, ",")
	default:
		return fmt.Sprint(x)
	}
}

func (f *field) Set(s string) error {
	switch f.v.Interface().(type) {
	case string:
		f.v.SetString(s)
	case bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		f.v.SetBool(b)
	case int, int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("want an integer")
		}
		f.v.SetInt(n)
	case float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("want a number")
		}
		f.v.SetFloat(x)
	case time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as 30s or 5m")
		}
		f.v.SetInt(int64(d))
	case []string:
		var list []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				list = append(list, p)
			}
		}
		f.v.Set(reflect.ValueOf(list))
	case map[string]float64:
		m := map[string]float64{}
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			k, v, ok := strings.Cut(p, "=")
			x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if !ok || err != nil {
				return fmt.Errorf("want name=number pairs, got %q", p)
			}
			m[strings.TrimSpace(k)] = x
		}
		f.v.Set(reflect.ValueOf(m))
	default:
		return fmt.Errorf("unsupported config field type %s", f.v.Type())
	}
	return nil
}
