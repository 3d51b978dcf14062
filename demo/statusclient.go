package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/flywheel-ai/flywheel/statusapi"
)

// maxStatusBody bounds a status answer: 20 rows of each list per
// deployment and a curve of about 60 buckets per version stay far below.
const maxStatusBody = 16 << 20

// ErrStatusNotFound is FetchStatus's answer for a deployment the key's
// tenant has no session on (or that does not exist).
var ErrStatusNotFound = errors.New("status: deployment not found")

// FetchStatus reads GET /v1/status from the gateway at baseURL (its root,
// with or without /v1) with apiKey: the control plane's own record of the
// deployment (its versions, releases and gates, decisions, training runs,
// the tenant's sessions and success curve), or of all the tenant's
// deployments when deployment is "".
func FetchStatus(ctx context.Context, baseURL, apiKey, deployment string) (*statusapi.Status, error) {
	root := strings.TrimSuffix(strings.TrimSuffix(baseURL, "/"), "/v1")
	u := root + "/v1/status"
	if deployment != "" {
		u += "?deployment=" + url.QueryEscape(deployment)
	}
	// The fleet shares the key and spends its rate limit: a reading taken
	// right after an evaluation used to meet a 429 and leave the summary
	// at zero.
	resp, err := doRetrying(ctx, http.DefaultClient, func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		return req, nil
	})
	if err != nil {
		return nil, fmt.Errorf("fetch status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		err := fmt.Errorf("fetch status of %q: status %d: %s", deployment, resp.StatusCode, strings.TrimSpace(string(msg)))
		if resp.StatusCode == http.StatusNotFound {
			err = fmt.Errorf("%w: %w", ErrStatusNotFound, err)
		}
		return nil, err
	}
	var st statusapi.Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatusBody)).Decode(&st); err != nil {
		return nil, fmt.Errorf("fetch status: decode answer: %w", err)
	}
	return &st, nil
}

// WeightsMoves is how many weights releases of deployment were promoted
// and rolled back between two status readings, from the control plane's
// release counts. Rolled back counts candidates its gates or canary
// refused and serving versions rolled back; aborted releases (a running
// one stopped by a rollback) count as neither. A deployment missing from
// a reading counts as zero there.
func WeightsMoves(before, after *statusapi.Status, deployment string) (promoted, rolledBack int) {
	count := func(st *statusapi.Status, status string) int {
		if st == nil {
			return 0
		}
		for _, d := range st.Deployments {
			if d.Name == deployment {
				return d.ReleaseCounts["weights"][status]
			}
		}
		return 0
	}
	return count(after, "promoted") - count(before, "promoted"), count(after, "rolled_back") - count(before, "rolled_back")
}

// trainedSteps is the deployment's count of trained steps in a reading.
func trainedSteps(st *statusapi.Status, deployment string) int {
	if st == nil {
		return 0
	}
	for _, d := range st.Deployments {
		if d.Name == deployment {
			return d.TrainingCounts["trained"]
		}
	}
	return 0
}

// CountFrom fills the run's counts from the control plane's readings of
// the deployment before and after it (before is nil when no session of
// ours had touched it). Held are the versions trained in the run that no
// release promoted or refused (a release of another version was running,
// or theirs was aborted); a rollback of a serving version counts as
// rolled back without a trained version of its own, so held is a lower
// bound.
func (s *Summary) CountFrom(before, after *statusapi.Status, deployment string) {
	s.VersionsPromoted, s.VersionsRolledBack = WeightsMoves(before, after, deployment)
	s.TrainSteps = trainedSteps(after, deployment) - trainedSteps(before, deployment)
	s.VersionsHeld = max(0, s.TrainSteps-s.VersionsPromoted-s.VersionsRolledBack)
	for _, d := range after.Deployments {
		if d.Name == deployment && d.ServingVersion != "" {
			s.ServingVersion = d.ServingVersion
		}
	}
}
