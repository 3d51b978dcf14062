package flow

import (
	"reflect"
	"runtime"
	"strings"
)

// ActivityName is the name an activity registered by method value has: the
// method's name, as the SDK derives it. Callers that read activity names
// back from Temporal (pending activities, histories) compare with it.
func ActivityName(method any) string {
	name := runtime.FuncForPC(reflect.ValueOf(method).Pointer()).Name()
	name = strings.TrimSuffix(name, "-fm")
	return name[strings.LastIndex(name, ".")+1:]
}
