// Command shaper is the shaper command line; see `shaper --help`.
package main

import (
	"context"
	"os"

	"github.com/shaperhq/shaper/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
