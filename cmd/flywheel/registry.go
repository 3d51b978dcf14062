package main

import (
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/workflow"
)

func workflowOpts(name string) workflow.RegisterOptions {
	return workflow.RegisterOptions{Name: name}
}

func activityOpts(name string) activity.RegisterOptions {
	return activity.RegisterOptions{Name: name}
}
