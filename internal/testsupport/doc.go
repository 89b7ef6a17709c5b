// Package testsupport groups the packages that exist only for shaper's
// tests, so that a newcomer can tell them from the product at a glance:
//
//   - redistest starts a real redis-server (or a 3-node Redis Cluster) on a
//     free port for a test and tears it down after;
//   - childproc runs shaper's own binaries and helpers as separate OS
//     processes, for the tests whose claims span processes;
//   - stall watches this process's scheduling stalls, so timing tests can
//     say when the host, not the product, missed a bound;
//   - apicheck holds every HTTP exchange a test makes to the published
//     OpenAPI document;
//   - this package itself has LockedBuffer, a log a running server or
//     command writes while the test reads it.
//
// Nothing outside a _test.go file or a test-only package imports them.
package testsupport
