package tinker

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// maxArchive bounds a sampler archive's unpacked size.
const maxArchive = 64 << 30

// DownloadSampler fetches sampler checkpoint name of model (the archive
// route redirects to the tar.gz, on the service or a storage URL) and
// unpacks it into dir, an empty directory. The API key goes to the
// service only, never to a storage host it redirects to.
func (c *Client) DownloadSampler(ctx context.Context, model, name, dir string) error {
	op := PathTrainingRuns + "/" + url.PathEscape(model) + "/checkpoints/" + url.PathEscape(name) + "/archive"
	loc, err := c.archiveLocation(ctx, op)
	if err != nil {
		return err
	}
	return c.fetchArchive(ctx, op, loc, dir)
}

// archiveLocation asks the archive route where the archive is: the
// redirect's target, or the route itself when it answers the bytes.
func (c *Client) archiveLocation(ctx context.Context, op string) (*url.URL, error) {
	base, err := url.Parse(c.BaseURL + op)
	if err != nil {
		return nil, fmt.Errorf("tinker archive: %w", err)
	}
	noFollow := *c.httpClient()
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	p := c.Retry.withDefaults()
	for try := 0; ; try++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.String(), nil)
		if err != nil {
			return nil, err
		}
		if c.APIKey != "" {
			req.Header.Set("X-API-Key", c.APIKey)
		}
		resp, err := noFollow.Do(req)
		fail := &APIError{Op: op, Retryable: true}
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			fail.Status = resp.StatusCode
			switch {
			case resp.StatusCode/100 == 3:
				loc, err := base.Parse(resp.Header.Get("Location"))
				if err != nil {
					return nil, &APIError{Op: op, Status: resp.StatusCode, Detail: "bad redirect: " + err.Error()}
				}
				return loc, nil
			case resp.StatusCode == http.StatusOK:
				return base, nil
			case resp.StatusCode == http.StatusTooEarly || retryableStatus(resp.StatusCode):
				fail.Detail = detailText(body) // 425: still being written
			default:
				fail.Detail, fail.Retryable = detailText(body), false
				return nil, fail
			}
		} else if ctx.Err() != nil {
			return nil, ctx.Err()
		} else {
			fail.Detail = err.Error()
		}
		if try >= 20 {
			return nil, fail
		}
		if err := c.wait(ctx, backoff(p, try, nil)); err != nil {
			return nil, err
		}
	}
}

// fetchArchive downloads the tar.gz at loc into dir.
func (c *Client) fetchArchive(ctx context.Context, op string, loc *url.URL, dir string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, loc.String(), nil)
	if err != nil {
		return err
	}
	if svc, err := url.Parse(c.BaseURL); err == nil && svc.Host == loc.Host && c.APIKey != "" {
		req.Header.Set("X-API-Key", c.APIKey)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return &APIError{Op: op, Detail: err.Error(), Retryable: true}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return &APIError{Op: op, Status: resp.StatusCode, Detail: detailText(body), Retryable: retryableStatus(resp.StatusCode)}
	}
	if err := Untar(resp.Body, dir); err != nil {
		return &APIError{Op: op, Detail: err.Error(), Retryable: true}
	}
	return nil
}

// Untar unpacks a tar.gz of regular files and directories into dir, each
// file synced.
// Links, devices, absolute paths and paths leaving dir are refused.
func Untar(r io.Reader, dir string) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	tr := tar.NewReader(zr)
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("archive: entry %q leaves the directory", h.Name)
		}
		path := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			total += h.Size
			if total > maxArchive {
				return fmt.Errorf("archive: more than %d bytes", int64(maxArchive))
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
			if err != nil {
				return fmt.Errorf("archive: %w", err)
			}
			_, err = io.CopyN(f, tr, h.Size)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("archive: %s: %w", h.Name, err)
			}
		default:
			return fmt.Errorf("archive: entry %q is not a file or a directory", h.Name)
		}
	}
}
