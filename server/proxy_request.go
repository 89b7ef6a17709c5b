package server

import (
	"context"
	"net/http"
)

// outboundRequest is the call as the upstream gets it, built on the
// target URL read once (readCall) rather than printed and parsed again
// for every send, as http.NewRequest would.
func outboundRequest(ctx context.Context, c callSpec, body []byte) *http.Request {
	req := &http.Request{
		Method:        c.method,
		URL:           c.target,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        c.header,
		Host:          c.target.Host,
		ContentLength: int64(len(body)),
		Body:          http.NoBody,
	}
	if len(body) > 0 || c.hasBody {
		// Read from the held body, which is let go once the answer is
		// relayed; the transport may send it again on a fresh connection.
		req.Body, req.GetBody = c.held.open()
	}
	return req.WithContext(ctx)
}
