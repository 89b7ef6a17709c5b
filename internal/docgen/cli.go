package main

import (
	"bytes"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/shaperhq/shaper/internal/cli"
)

// cliDir holds one page per command, named as cobra's doc generator names
// them (shaper_jobs_ls.md).
const cliDir = "docs/cli"

// cliPages renders every visible command of the tree `shaper` runs. The
// factory has no environment, so no default depends on the machine, and
// the date line cobra would add is off, so a page changes only with its
// command.
func cliPages() (map[string][]byte, error) {
	f := &cli.Factory{In: strings.NewReader(""), Out: io.Discard, ErrOut: io.Discard,
		LookupEnv: func(string) (string, bool) { return "", false }}
	root := cli.NewRootCmd(f)
	pages := map[string][]byte{}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		if !c.IsAvailableCommand() || c.IsAdditionalHelpTopicCommand() {
			return nil // hidden, deprecated or help: no page
		}
		c.DisableAutoGenTag = true
		var b bytes.Buffer
		if err := doc.GenMarkdownCustom(c, &b, func(s string) string { return s }); err != nil {
			return err
		}
		pages[cliDir+"/"+pageName(c)] = b.Bytes()
		for _, sub := range c.Commands() {
			if err := walk(sub); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	return pages, nil
}

// pageName is the file cobra's SEE ALSO links point at.
func pageName(c *cobra.Command) string {
	return strings.ReplaceAll(c.CommandPath(), " ", "_") + ".md"
}
