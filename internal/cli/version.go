package cli

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/metrics"
)

func newCmdVersion(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print shaper's version and the commit it was built from",
		Long: `Print shaper's version, the VCS revision it was built from (with -dirty for
uncommitted changes), and the Go version and platform. The version is the
one set with -ldflags at release, else the module version "go install"
records; the same values label the shaper_build_info metric.`,
		Example: "  shaper version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			version, revision, goversion := metrics.Build()
			_, err := fmt.Fprintln(f.Out, versionLine(Version, version, revision, goversion))
			return err
		},
	}
}

// shownVersion is the version set with -ldflags when there is one, else
// the module version in the build info, else "dev".
func shownVersion(ldflags, module string) string {
	if ldflags != "dev" && ldflags != "" {
		return ldflags
	}
	if module != "unknown" && module != "" {
		return module
	}
	return "dev"
}

// versionLine reads "shaper v1.2.3 (revision 0a1b2c3, go1.24.1, linux/amd64)".
func versionLine(ldflags, module, revision, goversion string) string {
	return fmt.Sprintf("shaper %s (revision %s, %s, %s/%s)", shownVersion(ldflags, module), revision, goversion, runtime.GOOS, runtime.GOARCH)
}
