#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine as root or on a developer's.
# Installs redis-server, redis-cli, promtool, chromium (for the status
# page's browser test), python3 and node (the producer examples) from
# Debian's packages when missing, then runs every package's tests with the
# race detector, vets the bench module, and vets and tests the module that
# checks the Kubernetes manifests and the one that drives the proxy with the
# vendors' Go SDKs.
set -euo pipefail
cd "$(dirname "$0")/.."

need_install=()
command -v redis-server >/dev/null 2>&1 || need_install+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_install+=(redis-tools)
command -v promtool >/dev/null 2>&1 || need_install+=(prometheus)
# Debian's package installs the browser as chromium; other systems may call it chromium-browser.
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need_install+=(chromium)
# The producer examples in other languages (examples/producers) run for real.
command -v python3 >/dev/null 2>&1 || need_install+=(python3)
command -v node >/dev/null 2>&1 || need_install+=(nodejs)
# npm installs the e2e clients (e2e/node); Debian packages it apart from node.
command -v npm >/dev/null 2>&1 || need_install+=(npm)
if [ ${#need_install[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "test.sh: ${need_install[*]} missing; run as root or: sudo apt-get install -y ${need_install[*]}" >&2
    exit 1
  fi
  echo "test.sh: installing ${need_install[*]} from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y "${need_install[@]}" >/dev/null 2>&1 || {
    apt-get update >/dev/null
    apt-get install -y "${need_install[@]}" >/dev/null
  }
  # Only promtool is used; the services the prometheus package starts are not.
  if [[ " ${need_install[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true
  fi
fi
# The package's own service is not needed: the tests start their own servers.
if command -v systemctl >/dev/null 2>&1; then systemctl disable --now redis-server >/dev/null 2>&1 || true; fi

# The clients nobody here wrote that e2e drives (the openai and stripe SDKs,
# the standardwebhooks verifier), pinned by e2e/node's lockfile.
if [ ! -d e2e/node/node_modules ] || [ e2e/node/package-lock.json -nt e2e/node/node_modules ]; then
  (cd e2e/node && npm ci --no-audit --no-fund >/dev/null)
fi
echo "test.sh: $(go version); $(redis-server --version | cut -d' ' -f1-3)" >&2
go vet ./...
# The pacing tests (leaky, e2e) measure throughput to within a percent of
# the limit across several processes; other packages' test binaries on the
# same two cores would skew them. So everything else runs first, two
# packages at a time, and then those two, one at a time.
timing=(./leaky ./e2e)
others=$(go list ./... | grep -v -e '/leaky$' -e '/e2e$')
go test -race -count=1 -timeout 15m "$@" $others
go test -race -count=1 -p 1 -timeout 15m "$@" "${timing[@]}"
if [ -f bench/go.mod ]; then
  (cd bench && go vet ./...)
fi
# The Kubernetes manifests' checks: a module of their own, so that k8s.io's
# dependencies stay out of shaper's go.mod.
if [ -f deploy/kubernetes/check/go.mod ]; then
  (cd deploy/kubernetes/check && go vet ./... && go test -count=1 ./...)
fi
# The vendors' Go SDKs (openai-go, stripe-go) through the proxy: a module of
# their own, so that they stay out of shaper's go.mod.
if [ -f e2e/gosdk/go.mod ]; then
  (cd e2e/gosdk && go vet ./... && go test -count=1 ./...)
fi
