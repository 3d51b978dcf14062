package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// BuildFile is one file of a build context.
type BuildFile struct {
	Path string
	Data []byte
	Mode int64
}

// DerivedImage describes an image built FROM a sandbox image.
type DerivedImage struct {
	// Repository is the image name; the tag is the content hash.
	Repository string
	// From is the parent image.
	From Image
	// Instructions follow the FROM line of the Dockerfile.
	Instructions []string
	// Files form the build context.
	Files []BuildFile
	// Labels are added to the image (LabelManaged is always set).
	Labels map[string]string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// EnsureDerivedImage builds d unless an image with the same content hash
// (parent, instructions, files) exists. The build has no network.
func EnsureDerivedImage(ctx context.Context, cli *client.Client, d DerivedImage) (Image, error) {
	if d.Repository == "" || d.From.Ref == "" {
		return Image{}, errors.New("derived image: repository and parent are required")
	}
	log := d.Logger
	if log == nil {
		log = slog.Default()
	}
	dockerfile := "FROM " + d.From.Ref + "\n" + strings.Join(d.Instructions, "\n") + "\n"
	files := append([]BuildFile(nil), d.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", imageBuildTag, d.From.ContentHash, dockerfile)
	labelKeys := make([]string, 0, len(d.Labels))
	for k := range d.Labels {
		labelKeys = append(labelKeys, k)
	}
	sort.Strings(labelKeys)
	for _, k := range labelKeys {
		fmt.Fprintf(h, "label\x00%s\x00%s\x00", k, d.Labels[k])
	}
	for _, f := range files {
		clean := path.Clean(f.Path)
		if f.Path == "" || path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || clean == "Dockerfile" {
			return Image{}, fmt.Errorf("derived image: bad context path %q", f.Path)
		}
		fmt.Fprintf(h, "file\x00%s\x00%o\x00%d\x00", clean, f.Mode, len(f.Data))
		h.Write(f.Data)
	}
	hash := hex.EncodeToString(h.Sum(nil))
	ref := d.Repository + ":" + hash[:16]
	img := Image{Ref: ref, ContentHash: hash, HasAgent: d.From.HasAgent}
	ok, err := imageExists(ctx, cli, ref)
	if err != nil || ok {
		return img, err
	}
	var buf bytes.Buffer
	tw := newTarWriter(&buf)
	tw.file("Dockerfile", []byte(dockerfile), 0o644, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		clean := path.Clean(f.Path)
		for dir := path.Dir(clean); dir != "." && !dirs[dir]; dir = path.Dir(dir) {
			dirs[dir] = true
		}
	}
	sortedDirs := make([]string, 0, len(dirs))
	for dir := range dirs {
		sortedDirs = append(sortedDirs, dir)
	}
	sort.Strings(sortedDirs)
	for _, dir := range sortedDirs {
		tw.dir(dir, 0o755, 0)
	}
	for _, f := range files {
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		tw.file(path.Clean(f.Path), f.Data, mode, 0)
	}
	if err := tw.close(); err != nil {
		return Image{}, err
	}
	labels := map[string]string{LabelKind: "derived", LabelContentHash: hash}
	for k, v := range d.Labels {
		labels[k] = v
	}
	start := time.Now()
	if err := buildImage(ctx, cli, &buf, ref, labels); err != nil {
		return Image{}, err
	}
	log.Info("sandbox image built", "image", ref, "elapsed", time.Since(start))
	img.Built = true
	return img, nil
}
