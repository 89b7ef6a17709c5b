package cli

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/shaperhq/shaper/config"
)

// upstreamCompleter completes upstream names for a command: from the
// config its --config flag (or $SHAPER_CONFIG) names, else, when the
// command reaches an API (api not nil, and --api or $SHAPER_API_URL set),
// from GET /v1/upstreams. configFlag points at the command's --config
// value, which cobra has parsed by the time it completes. A config that
// does not load, or an API that does not answer, completes nothing rather
// than printing an error into the shell.
func (f *Factory) upstreamCompleter(configFlag *string, api *apiFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		var names []string
		switch {
		case configFlag != nil && f.configPath(*configFlag) != "":
			cfg, err := config.Load(f.configPath(*configFlag), f.LookupEnv)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			names = cfg.UpstreamNames()
		case api != nil && api.url(f) != "":
			c, err := api.client(f)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
			defer cancel()
			ups, err := c.Upstreams(ctx)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			for _, u := range ups {
				names = append(names, u.Name)
			}
		}
		sort.Strings(names)
		var out []cobra.Completion
		for _, n := range names {
			if strings.HasPrefix(n, toComplete) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// argsCompleter completes the first argument only, for commands that take
// one upstream name.
func argsCompleter(complete cobra.CompletionFunc) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return complete(cmd, args, toComplete)
	}
}

// completionExamples documents how to load cobra's completion scripts.
const completionExamples = `  source <(shaper completion bash)                        # this bash session
  shaper completion bash > /etc/bash_completion.d/shaper  # every bash session
  shaper completion zsh > "${fpath[1]}/_shaper"           # zsh
  shaper completion fish > ~/.config/fish/completions/shaper.fish
  shaper pause <TAB>                                      # upstream names from $SHAPER_CONFIG or --config`

// addCompletionCmd adds cobra's completion command now, rather than when
// it runs, so that it carries examples.
func addCompletionCmd(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Long += `
Upstream names complete for pause, resume, jobs retry-dead and every
--upstream flag, read from the config that --config or $SHAPER_CONFIG names
(or, for enqueue and jobs, from the API that --api or $SHAPER_API_URL
names).`
			c.Example = completionExamples
		}
	}
}
