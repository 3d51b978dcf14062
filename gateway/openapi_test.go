package gateway_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/gateway"
)

// openAPIFile is the HTTP API's description, relative to this package.
var openAPIFile = filepath.Join("..", "docs", "openapi.yaml")

// unreachablePostgres is a Postgres nobody listens on. gateway.New needs a
// pool even when nothing is served (there is no gateway without its
// database), and pgxpool connects lazily: listing the routes never
// reaches it.
const unreachablePostgres = "postgres://openapi@127.0.0.1:1/openapi?sslmode=disable&connect_timeout=1"

var (
	ginParam      = regexp.MustCompile(`[:*]([^/]+)`)
	templateParam = regexp.MustCompile(`\{([^{}/]+)\}`)
)

// TestOpenAPIDescribesEveryRoute keeps docs/openapi.yaml honest: it
// describes exactly the routes the gateway registers, and it is a sound
// OpenAPI 3.1 document (unique operation ids, responses, resolvable
// references, declared path parameters).
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	doc, tree := readOpenAPI(t)
	require.True(t, strings.HasPrefix(doc.OpenAPI, "3.1"), "openapi: want 3.1.x, got %q", doc.OpenAPI)

	t.Run("routes", func(t *testing.T) {
		registered := registeredRoutes(t)
		described := doc.operationKeys()
		var problems []string
		for _, r := range minus(registered, described) {
			problems = append(problems, "registered but not described: "+r)
		}
		for _, r := range minus(described, registered) {
			problems = append(problems, "described but not registered: "+r)
		}
		require.Empty(t, problems, "docs/openapi.yaml must describe exactly the routes gateway/server.go registers")
	})
	t.Run("operations", func(t *testing.T) {
		require.Empty(t, doc.operationProblems())
	})
	t.Run("refs", func(t *testing.T) {
		var problems []string
		walkRefs(tree, func(ref string) {
			if err := resolveRef(tree, ref); err != nil {
				problems = append(problems, err.Error())
			}
		})
		slices.Sort(problems)
		require.Empty(t, problems)
	})
	t.Run("path parameters", func(t *testing.T) {
		require.Empty(t, doc.pathParameterProblems())
	})
}

// registeredRoutes are the gateway's routes as "METHOD /path/{param}".
func registeredRoutes(t *testing.T) []string {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), unreachablePostgres)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	srv, err := gateway.New(config.Default().Gateway, gateway.Deps{DB: pool, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	engine, ok := srv.Handler().(*gin.Engine)
	require.True(t, ok, "the gateway's handler is a *gin.Engine")
	var out []string
	for _, r := range engine.Routes() {
		out = append(out, r.Method+" "+ginParam.ReplaceAllString(r.Path, "{$1}"))
	}
	require.NotEmpty(t, out)
	return out
}

// minus is the sorted elements of a that are not in b.
func minus(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	slices.Sort(out)
	return out
}

// openAPIDoc is the part of an OpenAPI document the test checks.
type openAPIDoc struct {
	OpenAPI string `yaml:"openapi"`
	Tags    []struct {
		Name string `yaml:"name"`
	} `yaml:"tags"`
	Security   []map[string][]string      `yaml:"security"`
	Paths      map[string]openAPIPathItem `yaml:"paths"`
	Components struct {
		Parameters      map[string]openAPIParameter `yaml:"parameters"`
		SecuritySchemes map[string]any              `yaml:"securitySchemes"`
	} `yaml:"components"`
}

type openAPIPathItem struct {
	Parameters []openAPIParameter `yaml:"parameters"`
	Get        *openAPIOperation  `yaml:"get"`
	Put        *openAPIOperation  `yaml:"put"`
	Post       *openAPIOperation  `yaml:"post"`
	Delete     *openAPIOperation  `yaml:"delete"`
	Options    *openAPIOperation  `yaml:"options"`
	Head       *openAPIOperation  `yaml:"head"`
	Patch      *openAPIOperation  `yaml:"patch"`
	Trace      *openAPIOperation  `yaml:"trace"`
}

// operations are the path item's operations by HTTP method.
func (p openAPIPathItem) operations() map[string]*openAPIOperation {
	all := map[string]*openAPIOperation{
		http.MethodGet: p.Get, http.MethodPut: p.Put, http.MethodPost: p.Post, http.MethodDelete: p.Delete,
		http.MethodOptions: p.Options, http.MethodHead: p.Head, http.MethodPatch: p.Patch, http.MethodTrace: p.Trace,
	}
	out := map[string]*openAPIOperation{}
	for m, op := range all {
		if op != nil {
			out[m] = op
		}
	}
	return out
}

type openAPIOperation struct {
	OperationID string                `yaml:"operationId"`
	Summary     string                `yaml:"summary"`
	Tags        []string              `yaml:"tags"`
	Parameters  []openAPIParameter    `yaml:"parameters"`
	Security    []map[string][]string `yaml:"security"`
	Responses   map[string]any        `yaml:"responses"`
}

type openAPIParameter struct {
	Ref  string `yaml:"$ref"`
	Name string `yaml:"name"`
	In   string `yaml:"in"`
}

// readOpenAPI parses the document twice: into the fields the checks read,
// and whole, for following $refs.
func readOpenAPI(t *testing.T) (*openAPIDoc, map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(openAPIFile)
	require.NoError(t, err)
	var doc openAPIDoc
	require.NoError(t, yaml.Unmarshal(raw, &doc), "parse %s", openAPIFile)
	require.NotEmpty(t, doc.Paths, "%s describes no paths", openAPIFile)
	var tree map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &tree), "parse %s", openAPIFile)
	return &doc, tree
}

// eachOperation calls f for every operation, by path then method, so
// that problems are reported in the same order on every run.
func (d *openAPIDoc) eachOperation(f func(method, path string, item openAPIPathItem, op *openAPIOperation)) {
	for _, path := range slices.Sorted(maps.Keys(d.Paths)) {
		item := d.Paths[path]
		ops := item.operations()
		for _, method := range slices.Sorted(maps.Keys(ops)) {
			f(method, path, item, ops[method])
		}
	}
}

// operationKeys are the document's operations as "METHOD /path".
func (d *openAPIDoc) operationKeys() []string {
	var out []string
	d.eachOperation(func(method, path string, _ openAPIPathItem, _ *openAPIOperation) {
		out = append(out, method+" "+path)
	})
	return out
}

// operationProblems checks each operation's id, summary, tags, responses
// and security requirements.
func (d *openAPIDoc) operationProblems() []string {
	var problems []string
	tags := map[string]bool{}
	for _, tag := range d.Tags {
		tags[tag.Name] = true
	}
	checkSecurity := func(where string, reqs []map[string][]string) {
		for _, req := range reqs {
			for scheme := range req {
				if d.Components.SecuritySchemes[scheme] == nil {
					problems = append(problems, fmt.Sprintf("%s: security scheme %q is not in components.securitySchemes", where, scheme))
				}
			}
		}
	}
	checkSecurity("security", d.Security)
	ids := map[string]string{}
	d.eachOperation(func(method, path string, _ openAPIPathItem, op *openAPIOperation) {
		where := method + " " + path
		switch prev, dup := ids[op.OperationID]; {
		case op.OperationID == "":
			problems = append(problems, where+": no operationId")
		case dup:
			problems = append(problems, fmt.Sprintf("%s: operationId %q is also %s's", where, op.OperationID, prev))
		default:
			ids[op.OperationID] = where
		}
		if op.Summary == "" {
			problems = append(problems, where+": no summary")
		}
		if len(op.Tags) == 0 {
			problems = append(problems, where+": no tags")
		}
		for _, tag := range op.Tags {
			if !tags[tag] {
				problems = append(problems, fmt.Sprintf("%s: tag %q is not in the document's tags", where, tag))
			}
		}
		if len(op.Responses) == 0 {
			problems = append(problems, where+": no responses")
		}
		checkSecurity(where, op.Security)
	})
	return problems
}

// pathParameterProblems checks that each operation declares, itself or on
// its path item, exactly the parameters its path template names.
func (d *openAPIDoc) pathParameterProblems() []string {
	var problems []string
	d.eachOperation(func(method, path string, item openAPIPathItem, op *openAPIOperation) {
		where := method + " " + path
		var inTemplate, declared []string
		for _, m := range templateParam.FindAllStringSubmatch(path, -1) {
			inTemplate = append(inTemplate, m[1])
		}
		for _, p := range slices.Concat(item.Parameters, op.Parameters) {
			p, err := d.resolveParameter(p)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			if p.In == "path" {
				declared = append(declared, p.Name)
			}
		}
		for _, name := range minus(inTemplate, declared) {
			problems = append(problems, fmt.Sprintf("%s: path parameter %q is not declared", where, name))
		}
		for _, name := range minus(declared, inTemplate) {
			problems = append(problems, fmt.Sprintf("%s: path parameter %q is not in the path", where, name))
		}
	})
	return problems
}

func (d *openAPIDoc) resolveParameter(p openAPIParameter) (openAPIParameter, error) {
	if p.Ref == "" {
		return p, nil
	}
	name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/")
	if !ok {
		return p, fmt.Errorf("parameter $ref %q is not a components.parameters entry", p.Ref)
	}
	c, ok := d.Components.Parameters[name]
	if !ok {
		return p, fmt.Errorf("parameter $ref %q resolves to nothing", p.Ref)
	}
	return c, nil
}

// walkRefs calls f with every $ref in the document.
func walkRefs(node any, f func(ref string)) {
	switch n := node.(type) {
	case map[string]any:
		if ref, ok := n["$ref"].(string); ok {
			f(ref)
		}
		for _, v := range n {
			walkRefs(v, f)
		}
	case map[any]any:
		for _, v := range n {
			walkRefs(v, f)
		}
	case []any:
		for _, v := range n {
			walkRefs(v, f)
		}
	}
}

// resolveRef follows a local reference to a component, as JSON Pointer
// does (~1 is '/', ~0 is '~').
func resolveRef(tree map[string]any, ref string) error {
	pointer, ok := strings.CutPrefix(ref, "#/components/")
	if !ok {
		return fmt.Errorf("$ref %q: want a reference to #/components/…", ref)
	}
	var node any = tree["components"]
	for _, token := range strings.Split(pointer, "/") {
		token = strings.ReplaceAll(strings.ReplaceAll(token, "~1", "/"), "~0", "~")
		m, ok := node.(map[string]any)
		if !ok {
			return fmt.Errorf("$ref %q: %q is not inside an object", ref, token)
		}
		if node, ok = m[token]; !ok {
			return fmt.Errorf("$ref %q resolves to nothing", ref)
		}
	}
	if node == nil {
		return fmt.Errorf("$ref %q resolves to an empty component", ref)
	}
	return nil
}
