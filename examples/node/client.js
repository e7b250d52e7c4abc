// A Tributary client in plain JavaScript: @grpc/grpc-js with the protos loaded at run time from
// the repository's protos/ folder (no generated code). It uses a *default* gRPC client -- no
// receive limit raised -- to show what a client in any language meets:
//
//   1. health checking (grpc.health.v1, protos/grpc/health/v1/health.proto);
//   2. CreateTopic, then Produce of keyed records, reading each record's partition and offset;
//   3. the two error forms (common.proto): Produce to partition 99 answers OK with a
//      per-partition error; Produce to an unknown topic fails the call, and the reason is in the
//      google.rpc.Status / ErrorInfo of the `grpc-status-details-bin` trailer;
//   4. Fetch with default fields (max_bytes 0) of ~8 MB of records: each answer stays under
//      gRPC's default 4 MiB receive limit, and the client loops from `next_offset`;
//   5. a consumer group: JoinGroup, Heartbeat until the assignment settles, CommitOffsets,
//      FetchCommittedOffsets, DescribeGroup (group_state, client_id), LeaveGroup;
//   6. DeleteRecords below an offset.
//
// Usage: node client.js HOST:PORT [TOPIC]   (or TRIBUTARY_GATEWAY=HOST:PORT node client.js)
// Prints one JSON summary on stdout; any mismatch or unexpected error exits 1.
"use strict";

const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");
const protobuf = require("protobufjs");

const PROTOS = process.env.TRIBUTARY_PROTOS || path.resolve(__dirname, "..", "..", "protos");
const CLIENT_ID = "node-example";
const DEADLINE_MS = 30000;
const GRPC_DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024;
const PARTITIONS = 8;

const definition = protoLoader.loadSync(
  [
    "tributary/v1/gateway.proto",
    "grpc/health/v1/health.proto",
    "google/rpc/status.proto",
    "google/rpc/error_details.proto",
  ],
  // keepCase: field names as in the .proto; longs as strings (offsets are int64);
  // defaults: absent scalars read as their default, as in every other language.
  { includeDirs: [PROTOS], keepCase: true, longs: String, enums: String, bytes: Buffer, defaults: true, oneofs: true }
);
const loaded = grpc.loadPackageDefinition(definition);

function fail(message) {
  throw new Error(message);
}

function check(condition, message) {
  if (!condition) fail(message);
}

function deadline() {
  return new Date(Date.now() + DEADLINE_MS);
}

// A promise for one unary call, with the client id in the call metadata (as the SDK sends it).
function call(client, method, request) {
  const metadata = new grpc.Metadata();
  metadata.set("tributary-client-id", CLIENT_ID);
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: deadline() }, (error, response) =>
      error ? reject(error) : resolve(response)
    );
  });
}

// The Kafka reason of a failed call: google.rpc.Status in the grpc-status-details-bin trailer,
// whose details hold a google.rpc.ErrorInfo (domain "tributary.dev").
function errorInfo(error) {
  const [raw] = error.metadata ? error.metadata.get("grpc-status-details-bin") : [];
  check(raw, `the failed call carries no status details: ${error.message}`);
  const status = decodeStatus(raw);
  for (const detail of status.details) {
    if (detail.type_url === "type.googleapis.com/google.rpc.ErrorInfo") {
      return decodeErrorInfo(detail.value);
    }
  }
  fail("no ErrorInfo in the status details");
}

// Decoders for the two google.rpc messages, through the loaded package definition (the same
// serializers grpc-js would use), so nothing but protos/ is needed.
function messageCodec(fullName) {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => path.join(PROTOS, target);
  root.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
  return root.lookupType(fullName);
}
let statusCodec, errorInfoCodec;
function decodeStatus(buffer) {
  statusCodec = statusCodec || messageCodec("google.rpc.Status");
  return statusCodec.toObject(statusCodec.decode(buffer), { defaults: true });
}
function decodeErrorInfo(buffer) {
  errorInfoCodec = errorInfoCodec || messageCodec("google.rpc.ErrorInfo");
  return errorInfoCodec.toObject(errorInfoCodec.decode(buffer), { defaults: true });
}

// Fetch through the package's own (de)serializers, measuring each answer's size on the wire.
function fetchMeasured(client, request) {
  const method = loaded.tributary.v1.Gateway.service.Fetch;
  let size = 0;
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(
      method.path,
      method.requestSerialize,
      (buffer) => {
        size = buffer.length;
        return method.responseDeserialize(buffer);
      },
      request,
      new grpc.Metadata(),
      { deadline: deadline() },
      (error, response) => (error ? reject(error) : resolve({ response, size }))
    );
  });
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function waitOnline(gateway, topic) {
  for (let attempt = 0; attempt < 300; attempt++) {
    const metadata = await call(gateway, "GetMetadata", { topics: [topic] });
    const partitions = metadata.topics[0].partitions;
    if (partitions.length && partitions.every((p) => p.state === "PARTITION_STATE_ONLINE")) return partitions.length;
    await sleep(50);
  }
  fail(`${topic} never came online`);
}

// Every record of every partition, fetched with default fields from offset 0 to the high
// watermark; returns the records per partition and the largest answer seen.
async function fetchAll(gateway, topic, partitions) {
  const next = new Map(partitions.map((p) => [p, 0n]));
  const records = new Map(partitions.map((p) => [p, []]));
  let largest = 0;
  let answers = 0;
  for (;;) {
    const wanted = [...next].map(([partition, offset]) => ({ topic, partition, offset: offset.toString() }));
    const { response, size } = await fetchMeasured(gateway, { partitions: wanted });
    largest = Math.max(largest, size);
    answers += 1;
    let done = true;
    for (const result of response.partitions) {
      // Per-partition errors: an OK answer may still carry one for any partition.
      check(!result.error, `fetch of ${topic}-${result.partition}: ${JSON.stringify(result.error)}`);
      records.get(result.partition).push(...result.records);
      next.set(result.partition, BigInt(result.next_offset));
      if (BigInt(result.next_offset) < BigInt(result.high_watermark)) done = false;
    }
    if (done) return { records, largest, answers };
    check(answers < 1000, "fetch does not progress");
  }
}

async function main() {
  const address = process.argv[2] || process.env.TRIBUTARY_GATEWAY;
  check(address, "usage: node client.js HOST:PORT [TOPIC]");
  const topic = process.argv[3] || `node-example-${Date.now()}`;
  const credentials = grpc.credentials.createInsecure();
  // A default client: the receive limit stays gRPC's 4 MiB.
  const gateway = new loaded.tributary.v1.Gateway(address, credentials);
  const health = new loaded.grpc.health.v1.Health(address, credentials);
  const summary = { topic, client_id: CLIENT_ID };

  // 1. health
  const serving = await call(health, "Check", { service: "tributary.v1.Gateway" });
  check(serving.status === "SERVING", `health: ${serving.status}`);
  summary.health = serving.status;

  // 2. a topic, and keyed records
  await call(gateway, "CreateTopic", { name: topic, partitions: PARTITIONS });
  const partitions = [...Array(await waitOnline(gateway, topic)).keys()];
  const sent = [];
  for (let i = 0; i < 30; i++) {
    sent.push({
      key: Buffer.from(`user-${i % 7}`),
      value: Buffer.from(`event-${i}`),
      headers: [{ key: "source", value: Buffer.from("node") }],
    });
  }
  // Big values too, ~1 MB in each partition: ~8 MB in all, which one Fetch answer of Kafka's
  // defaults (1 MiB per partition, 50 MiB in all) would hold -- twice what a default client takes.
  for (let i = 0; i < 80; i++) {
    const value = Buffer.alloc(100 * 1024, i);
    value.write(`big-${i}`);
    sent.push({ key: Buffer.from(`big-${i}`), value, headers: [], partition: i % PARTITIONS });
  }
  const landed = [];
  for (let start = 0; start < sent.length; start += 10) {
    const chunk = sent.slice(start, start + 10);
    const produced = await call(gateway, "Produce", { topic, records: chunk, acks: "ACKS_ALL" });
    for (const result of produced.partitions) {
      check(!result.error, `produce to ${topic}-${result.partition}: ${JSON.stringify(result.error)}`);
    }
    produced.records.forEach((where, index) => landed.push({ ...where, sent: chunk[index] }));
  }
  check(landed.length === sent.length, "one result per record");
  summary.produced = landed.length;

  // 3. the two error forms
  const ninetyNine = await call(gateway, "Produce", {
    topic,
    records: [{ value: Buffer.from("lost"), partition: 99 }],
  });
  const perPartition = ninetyNine.partitions.find((p) => p.partition === 99);
  check(perPartition && perPartition.error, "partition 99 answered without an error");
  summary.partition_error = {
    reason: perPartition.error.reason,
    kafka_code: perPartition.error.kafka_code,
    retriable: perPartition.error.retriable,
  };
  try {
    await call(gateway, "Produce", { topic: `${topic}-missing`, records: [{ value: Buffer.from("x") }] });
    fail("produce to an unknown topic succeeded");
  } catch (error) {
    if (error.code === undefined) throw error;
    const info = errorInfo(error);
    summary.call_error = {
      code: grpc.status[error.code],
      reason: info.reason,
      domain: info.domain,
      kafka_code: info.metadata.kafka_code,
      retriable: info.metadata.retriable,
    };
  }

  // 4. everything back with default Fetch fields, compared with what was sent
  const fetched = await fetchAll(gateway, topic, partitions);
  summary.fetch = { largest_answer_bytes: fetched.largest, answers: fetched.answers };
  check(fetched.largest < GRPC_DEFAULT_RECEIVE_LIMIT, `an answer of ${fetched.largest} bytes`);
  let received = 0;
  for (const where of landed) {
    const got = fetched.records.get(where.partition).find((r) => r.offset === where.offset);
    check(got, `record at ${where.partition}/${where.offset} not fetched`);
    check(Buffer.compare(got.key, where.sent.key) === 0, `key at ${where.partition}/${where.offset}`);
    check(Buffer.compare(got.value, where.sent.value) === 0, `value at ${where.partition}/${where.offset}`);
    check(got.headers.length === where.sent.headers.length, "headers");
    received += 1;
  }
  const total = [...fetched.records.values()].reduce((n, list) => n + list.length, 0);
  check(total === sent.length, `fetched ${total} records for ${sent.length} sent`);
  summary.fetched = received;
  summary.records = landed
    .filter((where) => where.sent.value.length < 100)
    .map((where) => ({
      partition: where.partition,
      offset: where.offset,
      key: where.sent.key.toString(),
      value: where.sent.value.toString(),
    }));

  // 5. a consumer group
  const group = `${topic}-group`;
  let joined = await call(gateway, "JoinGroup", {
    group_id: group,
    subscription: { topics: [topic] },
    session_timeout_ms: 10000,
  });
  let owned = joined.assignment;
  let generation = joined.generation_id;
  for (let beat = 0; owned.length < partitions.length || joined.pending.length; beat++) {
    check(beat < 200, "the assignment never settled");
    await sleep(50);
    const answer = await call(gateway, "Heartbeat", {
      group_id: group,
      member_id: joined.member_id,
      generation_id: generation,
      owned,
      polled: true,
    });
    generation = answer.generation_id;
    owned = answer.assignment;
    joined = { ...joined, pending: answer.pending };
  }
  const ends = new Map();
  for (const [partition, list] of fetched.records) ends.set(partition, list.length ? BigInt(list[list.length - 1].offset) + 1n : 0n);
  const committed = await call(gateway, "CommitOffsets", {
    group_id: group,
    member_id: joined.member_id,
    generation_id: generation,
    offsets: owned.map((tp) => ({ topic, partition: tp.partition, offset: ends.get(tp.partition).toString() })),
  });
  for (const result of committed.results) {
    check(!result.error, `commit of ${topic}-${result.partition}: ${JSON.stringify(result.error)}`);
  }
  const readBack = await call(gateway, "FetchCommittedOffsets", { group_id: group });
  for (const entry of readBack.offsets) {
    check(BigInt(entry.offset) === ends.get(entry.partition), `committed offset of partition ${entry.partition}`);
  }
  const described = await call(gateway, "DescribeGroup", { group_id: group });
  summary.group = {
    group_id: group,
    state: described.state,
    group_state: described.group_state,
    client_ids: described.members.map((m) => m.client_id),
    committed: readBack.offsets.length,
    lag: described.partitions.map((p) => Number(p.lag)),
  };
  await call(gateway, "LeaveGroup", { group_id: group, member_id: joined.member_id });

  // 6. delete the records below offset 1 of partition 0
  const deleted = await call(gateway, "DeleteRecords", { partitions: [{ topic, partition: 0, offset: 1 }] });
  const deletion = deleted.partitions[0];
  check(!deletion.error, `delete records: ${JSON.stringify(deletion.error)}`);
  summary.log_start_offset = Number(deletion.log_start_offset);

  gateway.close();
  health.close();
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().catch((error) => {
  process.stderr.write(`node example failed: ${error.stack || error}\n`);
  process.exit(1);
});
