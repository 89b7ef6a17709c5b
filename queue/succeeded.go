package queue

import "github.com/shaperhq/shaper/internal/jobstore"

// SucceededJobMessage is SucceededMessage for a job the caller has already
// decoded from msg (DecodeJob), so the payload is not decoded a second
// time on every success. job is read, not changed; its Body and Headers
// (which may hold sensitive headers put back for the send) are left out
// of what is kept, as SucceededMessage leaves them out.
func SucceededJobMessage(msg *jobstore.Message, job *Job) *jobstore.Message {
	if len(job.Body) == 0 && len(job.Headers) == 0 {
		return msg
	}
	slim := *job
	slim.Body, slim.Headers = nil, nil
	b, err := EncodeJob(&slim)
	if err != nil {
		return msg
	}
	m := *msg
	m.Payload = b
	return &m
}
