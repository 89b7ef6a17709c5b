// Package check tests the kustomize base in ../base against Kubernetes' own
// API types, in a module of its own so that shaper's go.mod does not carry
// k8s.io's dependencies. It has no code: see check_test.go.
//
//	cd deploy/kubernetes/check && go test ./...
package check
