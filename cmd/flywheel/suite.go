package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/flywheel-ai/flywheel/store"
)

const suiteUsage = "flywheel suite set|show|list|delete --deployment D [--suite regression|safety|train] [--file FILE.jsonl]"

// runSuite manages a deployment's evaluation suites, as the admin API's
// /admin/v1/deployments/{name}/suites does.
func runSuite(ctx context.Context, args []string) error {
	v, rest, err := verb(args, suiteUsage)
	if err != nil {
		return err
	}
	var dep, suite, file string
	cfg, _, err := loadConfig("suite "+v, rest, func(fs *flag.FlagSet) {
		fs.StringVar(&dep, "deployment", "", "the deployment (model name); required")
		fs.StringVar(&suite, "suite", store.SuiteRegression, `"regression" (held-out prompts for the gates), "safety" (prompts to refuse) or "train" (prompts the harness search may look at)`)
		fs.StringVar(&file, "file", "", `set: the prompts, one JSON object a line: {"prompt": "...", "expect": "...", "match": "exact|contains|refusal"} `+
			`or {"messages": [...], "tools": [...], "expect": {"name": "...", "arguments": {...}}, "match": "tool_call"}; "-" reads standard input`)
	})
	if err != nil {
		return err
	}
	if dep == "" {
		return errors.New("suite: --deployment is required")
	}
	if err := store.CheckSuite(suite); err != nil {
		return fmt.Errorf("suite: --suite: %w", err)
	}
	var items []store.SuiteItem
	if v == "set" {
		if file == "" {
			return errors.New("suite set: --file is required")
		}
		if items, err = readSuiteFile(file); err != nil {
			return err
		}
	}
	pool, err := openStore(ctx, cfg.Database.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch v {
	case "set":
		prompts, err := store.SuitePrompts(suite, items)
		if err != nil {
			return fmt.Errorf("suite set: %w", err)
		}
		changed, err := store.SetEvalSuite(ctx, pool, dep, suite, prompts)
		if err != nil {
			return err
		}
		return printJSON(map[string]any{"deployment": dep, "suite": suite, "prompts": len(prompts), "changed": changed})
	case "show":
		rows, err := store.EvalSuite(ctx, pool, dep, suite)
		if err != nil {
			return err
		}
		out := make([]map[string]any, len(rows))
		for i, p := range rows {
			out[i] = map[string]any{"id": p.ID, "shared": p.Deployment == "", "messages": json.RawMessage(p.Messages),
				"expect": p.ExpectValue(), "match": p.Rule(suite), "max_tokens": p.MaxTokens, "temperature": p.Temperature}
			if len(p.Tools) > 0 {
				out[i]["tools"] = json.RawMessage(p.Tools)
			}
		}
		return printJSON(out)
	case "list":
		list, err := store.ListEvalSuites(ctx, pool, dep)
		if err != nil {
			return err
		}
		return printJSON(list)
	case "delete":
		n, err := store.DeleteEvalSuite(ctx, pool, dep, suite)
		if err != nil {
			return err
		}
		return printJSON(map[string]any{"deployment": dep, "suite": suite, "deleted": n})
	}
	return fmt.Errorf("usage: %s", suiteUsage)
}

// readSuiteFile reads JSONL suite items; blank lines and lines starting
// with # are skipped, and a bad line is named.
func readSuiteFile(path string) ([]store.SuiteItem, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("suite file: %w", err)
		}
		defer f.Close()
		r = f
	}
	var items []store.SuiteItem
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var it store.SuiteItem
		dec := json.NewDecoder(bytes.NewReader([]byte(line)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&it); err != nil {
			return nil, fmt.Errorf("suite file %s line %d: %w", path, n, err)
		}
		items = append(items, it)
		if len(items) > store.MaxSuitePrompts {
			return nil, fmt.Errorf("suite file %s: more than %d prompts", path, store.MaxSuitePrompts)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("suite file %s: %w", path, err)
	}
	return items, nil
}
