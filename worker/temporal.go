package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
	tlog "go.temporal.io/sdk/log"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/telemetry"
)

// Dial connects to the Temporal frontend.
func Dial(ctx context.Context, address, namespace string, logger *slog.Logger) (client.Client, error) {
	opts := client.Options{
		HostPort:  address,
		Namespace: namespace,
		Logger:    tlog.NewStructuredLogger(logger.With("component", "temporal")),
	}
	if telemetry.Enabled() {
		// Spans around workflow starts, signals, workflows and activities,
		// with the trace carried in Temporal's headers, so a model call's
		// trace continues into the session workflow it notifies.
		ti, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{})
		if err != nil {
			return nil, fmt.Errorf("temporal tracing: %w", err)
		}
		opts.Interceptors = []interceptor.ClientInterceptor{ti}
	}
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to temporal at %s: %w", address, err)
	}
	return c, nil
}

// Setup registers the namespace (if missing) and Flywheel's custom search
// attributes (those missing), so it is safe to run at every start and
// against a production cluster as well as the dev server.
func Setup(ctx context.Context, c client.Client, namespace string) error {
	_, err := c.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
		Namespace:                        namespace,
		Description:                      "Flywheel sessions, rollouts, training, evolution and releases",
		WorkflowExecutionRetentionPeriod: durationpb.New(7 * 24 * time.Hour),
	})
	var exists *serviceerror.NamespaceAlreadyExists
	if err != nil && !errors.As(err, &exists) {
		return fmt.Errorf("register namespace %s: %w", namespace, err)
	}
	have, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("list search attributes: %w", err)
	}
	want := flow.SearchAttributes()
	missing := &operatorservice.AddSearchAttributesRequest{Namespace: namespace, SearchAttributes: map[string]enumspb.IndexedValueType{}}
	for name, typ := range want {
		if _, ok := have.GetCustomAttributes()[name]; !ok {
			missing.SearchAttributes[name] = typ
		}
	}
	if len(missing.SearchAttributes) == 0 {
		return nil
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, missing); err != nil {
		names := make([]string, 0, len(missing.SearchAttributes))
		for n := range missing.SearchAttributes {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("add search attributes %v: %w", names, err)
	}
	return nil
}
