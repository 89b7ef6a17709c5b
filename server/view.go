package server

import "github.com/shaperhq/shaper/queue"

// ViewJob is a job as the API shows it (GET /v1/jobs/{id}), so that tools
// reading Redis directly (shaper jobs --config) print what the API would.
func ViewJob(i *queue.Info) JobView { return jobView(i) }
