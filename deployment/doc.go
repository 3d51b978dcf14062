// Package deployment owns what a deployment is: the engine that serves it
// and how to call it, its served model and tokenizer, how trained weights
// reach the engine, which trainer trains it, and the policy its releases
// are judged by. Each concept has one type here, with its defaults and a
// validation that names the bad field, as package config does for the
// binary.
//
// The store persists a Deployment; the gateway, the gates, training and
// weight sync read it; the engine clients in package inference are built
// from it. It must not do I/O or know any of those callers.
package deployment
