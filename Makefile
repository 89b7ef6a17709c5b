.PHONY: test build bench fmt
# The test command the README gives and CI runs.
test:
	./scripts/test.sh

build:
	go build -o bin/shaper ./cmd/shaper

bench:
	cd bench && go run ./cmd/admission

fmt:
	gofmt -l -w .
