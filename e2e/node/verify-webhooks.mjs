// Verifies callback deliveries with the standardwebhooks package (written
// elsewhere, by the Standard Webhooks authors): reads a JSON array of
// {secret, headers, body} on stdin and prints {"verified": n, "failed":
// [{index, error}]}.
import { Webhook } from "standardwebhooks";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const deliveries = JSON.parse(input);
const failed = [];
let verified = 0;
deliveries.forEach((d, index) => {
  try {
    new Webhook(d.secret).verify(d.body, d.headers);
    verified++;
  } catch (err) {
    failed.push({ index, error: String(err && err.message ? err.message : err) });
  }
});
process.stdout.write(JSON.stringify({ verified, failed }));
