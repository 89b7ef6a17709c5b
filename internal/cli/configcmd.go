package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/config"
)

func newCmdConfig(f *Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with config files",
		Long: `Work with config files. "validate" checks one without starting anything:
run it in CI, or before a deploy, on every config you ship.`,
		Example: `  shaper config validate shaper.yaml
  STRIPE_SECRET_KEY=x OPENAI_API_KEY=x shaper config validate deploy/shaper.example.yaml
  for f in deploy/*.yaml; do shaper config validate "$f" || exit 1; done`,
	}
	cmd.AddCommand(newCmdConfigValidate(f))
	return cmd
}

func newCmdConfigValidate(f *Factory) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a config file and explain each problem",
		Long: `Check a config file: YAML syntax, unknown keys, every value, ${ENV}
references. Every problem is listed with its line and field, and the exit
status is 1 if there is any. A valid config is summarised: each upstream's
limits and the rate a full backlog drains at.`,
		Example: `  shaper config validate shaper.yaml
  STRIPE_SECRET_KEY=sk_test_x OPENAI_API_KEY=sk-x shaper config validate deploy/shaper.example.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load(args[0], f.LookupEnv)
			if err != nil {
				var ce *config.Error
				if errors.As(err, &ce) {
					fmt.Fprintf(f.ErrOut, "%s: %d problem(s):\n", args[0], len(ce.Problems))
					for _, p := range ce.Problems {
						fmt.Fprintf(f.ErrOut, "  %s\n", p)
					}
					return exitCode(1)
				}
				return err
			}
			fmt.Fprintf(f.Out, "%s: valid\n%s", args[0], cfg.Summary())
			return nil
		},
	}
}
