// Package tinker speaks the Tinker training API: the HTTP contract that
// Thinking Machines' Tinker serves and that SkyRL tx, OpenRL and other
// trainers re-implement on their own GPUs. Flywheel trains every
// deployment through it, the embedded Go trainer included (package
// tinkerserver serves the same routes over the built-in policy).
//
// wire.go holds the request and answer bodies as SkyRL tx's
// skyrl/tinker/api.py and types.py define them (the official SDK agrees);
// client.go drives them: each call answers {request_id}, and
// retrieve_future long-polls for the result, 408 or a try_again body
// meaning "not yet". datum.go turns a captured sample into the datum the
// losses read.
package tinker
