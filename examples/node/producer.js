#!/usr/bin/env node
// A thin Gregor producer in Node.js. It speaks only to a producer gateway
// (proto/gregor/rpc/v1/gateway.proto, loaded at runtime): the gateway
// partitions, batches, compresses and retries, so this client just sends records.
//
//   node producer.js --gateway 127.0.0.1:7001[,127.0.0.1:7002] --topic orders \
//        [--mode unary|stream|stream-batch] [--batch-size 500] [--count 10] [--key-prefix user-] [--partition 0] [--prefix node-]
//   printf 'k1:hello\nk2:world\n' | node producer.js --gateway ... --topic orders --stdin
//
// Prints one JSON line per record, {"correlation_id","partition","offset","timestamp_ms"} or
// {"correlation_id","error":{"code","message","retriable"}}, and exits 1 if any record failed.
// With several gateways it moves to the next one when a call fails with UNAVAILABLE.
'use strict';

const path = require('path');
const readline = require('readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = process.env.GREGOR_PROTO_DIR || path.resolve(__dirname, '..', '..', 'proto');
const MAX_MESSAGE_BYTES = 100 * 1024 * 1024; // the servers' limit (Kafka's socket.request.max.bytes)

function loadGatewayService() {
  const definition = protoLoader.loadSync('gregor/rpc/v1/gateway.proto', {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String, // int64 offsets and timestamps arrive as decimal strings
    enums: String, // error codes by their Kafka names
    bytes: Buffer,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).gregor.rpc.v1.ProducerGatewayService;
}

function parseArgs(argv) {
  const opts = { mode: 'unary', count: 10, prefix: 'node-', keyPrefix: null, partition: null, stdin: false,
                 separator: ':', deadlineMs: 30000, batchSize: 500 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    switch (arg) {
      case '--gateway': opts.gateways = next().split(',').filter(Boolean); break;
      case '--topic': opts.topic = next(); break;
      case '--mode': opts.mode = next(); break;
      case '--count': opts.count = parseInt(next(), 10); break;
      case '--prefix': opts.prefix = next(); break;
      case '--key-prefix': opts.keyPrefix = next(); break;
      case '--partition': opts.partition = parseInt(next(), 10); break;
      case '--stdin': opts.stdin = true; break;
      case '--key-separator': opts.separator = next(); break;
      case '--deadline-ms': opts.deadlineMs = parseInt(next(), 10); break;
      case '--batch-size': opts.batchSize = parseInt(next(), 10); break;
      case '-h': case '--help':
        console.log('usage: node producer.js --gateway HOST:PORT[,...] --topic T [--mode unary|stream|stream-batch] ' +
                    '[--batch-size N] ' +
                    '[--count N] [--prefix P] [--key-prefix K] [--partition P] [--stdin [--key-separator S]]');
        process.exit(0);
        break;
      default: throw new Error(`unknown argument ${arg}`);
    }
  }
  if (!opts.gateways || !opts.gateways.length) throw new Error('--gateway HOST:PORT is required');
  if (!opts.topic) throw new Error('--topic is required');
  if (!['unary', 'stream', 'stream-batch'].includes(opts.mode)) {
    throw new Error('--mode is unary, stream or stream-batch');
  }
  if (!(opts.batchSize >= 1)) throw new Error('--batch-size must be at least 1');
  if (!(opts.count >= 0)) throw new Error('--count must be a non-negative number');
  return opts;
}

// A Record message: absent key/value mean null, as in Kafka.
function makeRecord(key, value) {
  const rec = { headers: [{ key: 'client', value: Buffer.from('node') }] };
  if (key !== null && key !== undefined) rec.key = Buffer.from(key);
  if (value !== null && value !== undefined) rec.value = Buffer.from(value);
  return rec;
}

async function readRecords(opts) {
  if (!opts.stdin) {
    const out = [];
    for (let i = 0; i < opts.count; i++) {
      out.push(makeRecord(opts.keyPrefix === null ? null : `${opts.keyPrefix}${i}`, `${opts.prefix}${i}`));
    }
    return out;
  }
  const out = [];
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of rl) {
    const at = line.indexOf(opts.separator);
    out.push(at < 0 ? makeRecord(null, line) : makeRecord(line.slice(0, at), line.slice(at + opts.separator.length)));
  }
  return out;
}

class GatewayClient {
  constructor(Service, targets) {
    this.Service = Service;
    this.targets = targets;
    this.current = 0;
    this.clients = new Map();
  }

  client() {
    const target = this.targets[this.current];
    if (!this.clients.has(target)) {
      this.clients.set(target, new this.Service(target, grpc.credentials.createInsecure(), {
        'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
        'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      }));
    }
    return this.clients.get(target);
  }

  failOver() {
    this.current = (this.current + 1) % this.targets.length;
  }

  close() {
    for (const c of this.clients.values()) c.close();
  }

  // Unary Produce: one result per record, in order. UNAVAILABLE -> next gateway (the records of a
  // call that got no answer may already be written: resending them can duplicate them).
  async produce(topic, records, partition, deadlineMs) {
    const request = { topic, records };
    if (partition !== null) request.partition = partition;
    let lastError = null;
    for (let attempt = 0; attempt < 2 * this.targets.length; attempt++) {
      try {
        return await new Promise((resolve, reject) => {
          this.client().Produce(request, { deadline: Date.now() + deadlineMs }, (err, resp) => {
            if (err) reject(err); else resolve(resp.results);
          });
        });
      } catch (err) {
        if (err.code !== grpc.status.UNAVAILABLE) throw err;
        lastError = err;
        this.failOver();
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    throw lastError;
  }

  // ProduceStream: every record written to the stream, results matched by correlation_id.
  produceStream(topic, records, partition, deadlineMs) {
    return new Promise((resolve, reject) => {
      const results = [];
      const call = this.client().ProduceStream({ deadline: Date.now() + deadlineMs });
      call.on('data', (r) => results.push(r));
      call.on('error', reject);
      call.on('end', () => resolve(results));
      records.forEach((record, i) => {
        const msg = { topic, record, correlation_id: i };
        if (partition !== null) msg.partition = partition;
        call.write(msg);
      });
      call.end();
    });
  }

  // ProduceStreamBatch: records written batchSize per message (one gRPC message per batch, as Kafka's
  // clients batch), results arriving in batches too; matched by correlation_id. Much faster than
  // ProduceStream when records are many; use it for throughput.
  produceStreamBatch(topic, records, partition, deadlineMs, batchSize) {
    return new Promise((resolve, reject) => {
      const results = [];
      const call = this.client().ProduceStreamBatch({ deadline: Date.now() + deadlineMs });
      call.on('data', (batch) => results.push(...batch.results));
      call.on('error', reject);
      call.on('end', () => resolve(results));
      for (let first = 0; first < records.length; first += batchSize) {
        const batch = records.slice(first, first + batchSize).map((record, j) => {
          const msg = { topic, record, correlation_id: first + j };
          if (partition !== null) msg.partition = partition;
          return msg;
        });
        call.write({ records: batch });
      }
      call.end();
    });
  }
}

function describe(result) {
  if (result.error && result.error.code !== 'NONE') {
    const { code, message, retriable } = result.error;
    return { correlation_id: Number(result.correlation_id), error: { code, message, retriable } };
  }
  return { correlation_id: Number(result.correlation_id), partition: result.partition,
           offset: Number(result.offset), timestamp_ms: Number(result.timestamp_ms) };
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) {
    console.error(`error: ${err.message}`);
    return 2;
  }
  const client = new GatewayClient(loadGatewayService(), opts.gateways);
  try {
    const records = await readRecords(opts);
    let results;
    if (opts.mode === 'unary') {
      results = await client.produce(opts.topic, records, opts.partition, opts.deadlineMs);
    } else if (opts.mode === 'stream') {
      results = await client.produceStream(opts.topic, records, opts.partition, opts.deadlineMs);
    } else {
      results = await client.produceStreamBatch(opts.topic, records, opts.partition, opts.deadlineMs, opts.batchSize);
    }
    results.sort((a, b) => Number(a.correlation_id) - Number(b.correlation_id));
    let failed = 0;
    for (const r of results) {
      const line = describe(r);
      if (line.error) failed++;
      console.log(JSON.stringify(line));
    }
    return failed ? 1 : 0;
  } catch (err) {
    console.error(`error: ${grpc.status[err.code] || ''} ${err.details || err.message}`);
    return 1;
  } finally {
    client.close();
  }
}

main().then((code) => { process.exitCode = code; });
