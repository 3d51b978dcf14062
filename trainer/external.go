package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DirTrainer is the Trainer for models too large for the built-in one: each
// step is handed to an existing (distributed) trainer through a directory,
// and the weights it produces come back as a new version.
//
// The protocol, per step N (N zero-padded to 12 digits):
//
//  1. Flywheel writes DIR/batches/N.jsonl (Batch.WriteJSONL: a header line,
//     then one Sample per line with token_ids, loss_mask, logprobs,
//     versions, group_id, reward and the advantage already computed). The
//     file appears atomically (written aside, then renamed).
//  2. The external trainer runs the step and writes
//     DIR/checkpoints/N.safetensors in SaveCheckpoint's format (tensor names
//     and shapes of the model layout; metadata format, version, config),
//     again atomically. Its version must be newer than the serving one.
//  3. Flywheel loads it, publishes it and returns.
//
// ServeDir is the other side of this protocol run by the built-in trainer;
// it doubles as the reference for an external implementation.
type DirTrainer struct {
	dir  string
	poll time.Duration
	pub  Publisher
	adv  AdvantageConfig
	base *Baseline
	log  *slog.Logger
	seq  int64
}

// NewDirTrainer uses dir (created if missing) and polls for checkpoints
// every poll (default 200ms). pub (may be nil) receives every new version.
func NewDirTrainer(dir string, poll time.Duration, adv AdvantageConfig, pub Publisher, log *slog.Logger) (*DirTrainer, error) {
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	if log == nil {
		log = slog.Default()
	}
	adv = adv.withDefaults()
	if err := adv.validate(); err != nil {
		return nil, err
	}
	for _, sub := range []string{"batches", "checkpoints"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("dir trainer: %w", err)
		}
	}
	// Continue numbering after what an earlier process left.
	seq, err := lastSeq(filepath.Join(dir, "batches"), ".jsonl")
	if err != nil {
		return nil, fmt.Errorf("dir trainer: %w", err)
	}
	return &DirTrainer{dir: dir, poll: poll, pub: pub, adv: adv, base: NewBaseline(adv.BaselineRate), log: log, seq: seq}, nil
}

func seqName(n int64) string { return fmt.Sprintf("%012d", n) }

func lastSeq(dir, ext string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var last int64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ext)
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(name, 10, 64); err == nil && n > last {
			last = n
		}
	}
	return last, nil
}

// writeAtomic writes data via a temporary file and a rename.
func writeAtomic(path string, write func(f *os.File) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// TrainStep exports b, waits for the external trainer's checkpoint (until
// ctx ends) and publishes it.
func (d *DirTrainer) TrainStep(ctx context.Context, b *Batch) (StepResult, error) {
	start := time.Now()
	if b == nil || len(b.Samples) == 0 {
		return StepResult{}, errors.New("dir train step: empty batch")
	}
	out := *b
	out.Samples = append([]Sample(nil), b.Samples...)
	var res StepResult
	if out.Objective != ObjectiveSFT {
		st, err := ComputeAdvantages(out.Samples, d.adv, d.base)
		if err != nil {
			return res, fmt.Errorf("dir train step: %w", err)
		}
		res.Advantages = st
	}
	d.seq++
	name := seqName(d.seq)
	batchPath := filepath.Join(d.dir, "batches", name+".jsonl")
	if err := writeAtomic(batchPath, func(f *os.File) error { return out.WriteJSONL(f) }); err != nil {
		return res, fmt.Errorf("dir train step: export batch: %w", err)
	}
	d.log.Info("batch exported", "path", batchPath, "samples", len(out.Samples))
	ckpt := filepath.Join(d.dir, "checkpoints", name+".safetensors")
	tick := time.NewTicker(d.poll)
	defer tick.Stop()
	for {
		if _, err := os.Stat(ckpt); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("dir train step: waiting for %s: %w", ckpt, ctx.Err())
		case <-tick.C:
		}
	}
	m, version, _, err := LoadCheckpoint(ckpt)
	if err != nil {
		return res, fmt.Errorf("dir train step: %w", err)
	}
	if d.pub != nil {
		if err := d.pub.Publish(m, version); err != nil {
			return res, fmt.Errorf("dir train step: %w", err)
		}
	}
	res.Version, res.Samples, res.Duration = version, len(out.Samples), time.Since(start)
	for _, s := range out.Samples {
		res.TotalTokens += len(s.TokenIDs)
		res.MeanReward += s.Reward / float64(len(out.Samples))
	}
	return res, nil
}

// ServeDir runs the external side of DirTrainer's protocol with the built-in
// trainer: it trains on every batch that appears under dir and writes the
// resulting checkpoint, until ctx ends. Advantages in the files are used as
// they are.
func ServeDir(ctx context.Context, dir string, l *Local, poll time.Duration) error {
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	for _, sub := range []string{"batches", "checkpoints"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return fmt.Errorf("serve dir: %w", err)
		}
	}
	done, err := lastSeq(filepath.Join(dir, "checkpoints"), ".safetensors")
	if err != nil {
		return fmt.Errorf("serve dir: %w", err)
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		next := filepath.Join(dir, "batches", seqName(done+1)+".jsonl")
		f, err := os.Open(next)
		if err == nil {
			b, rerr := ReadBatchJSONL(f)
			f.Close()
			if rerr != nil {
				return fmt.Errorf("serve dir: %s: %w", next, rerr)
			}
			res, terr := l.TrainStep(ctx, b)
			if terr != nil {
				return fmt.Errorf("serve dir: %s: %w", next, terr)
			}
			ckpt := filepath.Join(dir, "checkpoints", seqName(done+1)+".safetensors")
			if err := SaveCheckpoint(ckpt, l.Snapshot(), res.Version, map[string]string{"batch": filepath.Base(next)}); err != nil {
				return fmt.Errorf("serve dir: %w", err)
			}
			done++
			continue
		}
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("serve dir: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
