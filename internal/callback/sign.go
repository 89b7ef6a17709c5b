package callback

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// The Standard Webhooks headers (standardwebhooks.com).
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Sign is the webhook-signature of one attempt: "v1," and the base64 of
// the HMAC-SHA256, under the decoded secret, of id "." timestamp "." body,
// as Standard Webhooks defines it.
func Sign(secret []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// WebhookID is the webhook-id of every attempt to deliver a job's seq-th
// final state (a job that died and was retried by an operator reaches
// another): the same through retries and crashes, so a receiver
// de-duplicates by it.
func WebhookID(jobID string, seq int) string {
	return "msg_" + jobID + "_" + strconv.Itoa(max(seq, 1))
}
