// Package deploy holds deployment examples (deploy/kubernetes) and the
// tests that keep them consistent with the code: the manifests parse, the
// probes hit the admin listener's health endpoints, the containers share
// the agent socket directory, and the Dockerfile builds with the same
// command line as CI.
package deploy
