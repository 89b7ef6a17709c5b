// customers.create through shaper's proxy with the stripe package,
// unchanged: the SDK's key is the shaper key, and host and port are the
// upstream's own proxy listener (upstreams.NAME.proxy.listen), since
// Stripe's Node library changes only those. Retries are off.
//
//   SHAPER_HOST=127.0.0.1 SHAPER_PORT=8701 SHAPER_KEY=... node stripe.mjs [CALLS]
//
// Prints one JSON line per call: {i, ok, id, email, name, metadata, ms} or
// {i, ok: false, status, error, ms}.
import Stripe from "stripe";

const calls = Number(process.argv[2] ?? 1);
const stripe = new Stripe(process.env.SHAPER_KEY, {
  host: process.env.SHAPER_HOST,
  port: Number(process.env.SHAPER_PORT),
  protocol: "http",
  maxNetworkRetries: 0,
});

async function call(i) {
  const start = performance.now();
  const ms = () => Math.round(performance.now() - start);
  try {
    const c = await stripe.customers.create({
      email: `customer${i}@example.com`,
      name: `Customer ${i}`,
      metadata: { call: String(i) },
    });
    return { i, ok: true, id: c.id, email: c.email, name: c.name, metadata: c.metadata, ms: ms() };
  } catch (err) {
    if (!(err instanceof Stripe.errors.StripeError)) throw err;
    return { i, ok: false, status: err.statusCode ?? 0, error: err.type, message: err.message, ms: ms() };
  }
}

await Promise.all(Array.from({ length: calls }, (_, i) => call(i).then((r) => console.log(JSON.stringify(r)))));
