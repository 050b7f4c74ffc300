// Validates Kubernetes manifests offline against the Kubernetes API schemas.
//
//   (cd launch/k8s/schema && npm ci)            # once: the pinned schema packages
//   node launch/k8s/schema/validate.mjs DIR|FILE.json ...
//
// The schemas: kubernetes-models (validators generated from the Kubernetes
// OpenAPI spec: types, required fields, enums, formats) and, for the
// Prometheus Operator's ServiceMonitor/PodMonitor, @kubernetes-models/
// prometheus-operator (from its CRDs); versions pinned in package-lock.json.
// The OpenAPI spec does not forbid unknown fields (the API server does, with
// strict field validation), so an unknown field is also an error here: every
// object a generated validator reads is wrapped in a Proxy recording which
// properties it looked up, and a property the validator never looked up, in
// an object whose properties it did look up, is unknown. Free-form objects
// (which a validator never looks into) are not checked.
//
// Reads JSON only (psrun --format json): one object per file, a List
// ({"kind": "List", "items": [...]}) or an array. Prints one line per object,
// "ok KIND NAME" or "error FILE: KIND NAME: PATH MESSAGE"; exit 0 if all are
// valid, 1 if any is not, 2 on bad usage or an object of a kind with no schema.
import fs from "node:fs";
import path from "node:path";

// apiVersion -> module folder holding one module per kind.
function modulePath(apiVersion, kind) {
  if (!/^[A-Za-z0-9]+$/.test(kind)) return null;
  if (apiVersion === "v1") return `kubernetes-models/v1/${kind}`;
  if (apiVersion.startsWith("monitoring.coreos.com/"))
    return `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`;
  if (/^[a-z0-9.]+\/v[0-9a-z]+$/.test(apiVersion)) return `kubernetes-models/${apiVersion}/${kind}`;
  return null;
}

// A deep Proxy over `data` that records, per object, which keys were read.
function tracked(data) {
  const seen = new Map();  // target object -> Set of keys read (or "touched" marker)
  const proxies = new Map();
  function wrap(v) {
    if (v === null || typeof v !== "object") return v;
    if (proxies.has(v)) return proxies.get(v);
    const keys = new Set();
    seen.set(v, keys);
    const p = new Proxy(v, {
      get(t, k, r) {
        keys.add(k);
        return wrap(Reflect.get(t, k, r));
      },
      has(t, k) {
        keys.add(k);
        return Reflect.has(t, k);
      },
      ownKeys(t) {
        // A validator that enumerates the keys checks every one of them
        // (maps such as labels, or additionalProperties: false).
        for (const k of Reflect.ownKeys(t)) keys.add(k);
        return Reflect.ownKeys(t);
      },
    });
    proxies.set(v, p);
    return p;
  }
  return { root: wrap(data), seen };
}

function unknownFields(data, seen, at = "") {
  const out = [];
  if (data === null || typeof data !== "object") return out;
  const keys = seen.get(data);
  if (Array.isArray(data)) {
    data.forEach((v, i) => out.push(...unknownFields(v, seen, `${at}/${i}`)));
    return out;
  }
  // Never read through, or read only by a type check: free-form, not judged.
  const touched = keys && [...keys].some((k) => typeof k === "string");
  for (const k of Object.keys(data)) {
    if (touched && !keys.has(k)) out.push(`data${at}/${k} is not a field of this object`);
    else out.push(...unknownFields(data[k], seen, `${at}/${k}`));
  }
  return out;
}

async function validateObject(obj) {
  if (!obj || typeof obj !== "object" || Array.isArray(obj))
    return { usage: "not an object" };
  const { apiVersion, kind } = obj;
  const mod = typeof apiVersion === "string" && typeof kind === "string"
    ? modulePath(apiVersion, kind) : null;
  let cls = null;
  if (mod) {
    try {
      cls = (await import(mod))[kind];
    } catch (e) {
      if (e.code !== "ERR_PACKAGE_PATH_NOT_EXPORTED" && e.code !== "ERR_MODULE_NOT_FOUND") throw e;
    }
  }
  if (!cls) return { usage: `no schema for apiVersion ${apiVersion} kind ${kind}` };
  const { root, seen } = tracked(obj);
  const errors = [];
  try {
    cls.prototype.validate.call(root);  // runValidateFunc(schema, this): throws on errors
  } catch (e) {
    if (!e.errors) throw e;
    errors.push(...e.errors.map((err) => `data${err.instancePath} ${err.message}`));
  }
  errors.push(...unknownFields(obj, seen));
  return { errors };
}

function inputs(args) {
  const files = [];
  for (const a of args) {
    if (fs.statSync(a).isDirectory()) {
      for (const f of fs.readdirSync(a).sort())
        if (f.endsWith(".json")) files.push(path.join(a, f));
    } else {
      files.push(a);
    }
  }
  return files;
}

async function main(args) {
  if (!args.length) {
    process.stderr.write("usage: validate.mjs DIR|FILE.json ...\n");
    return 2;
  }
  let status = 0;
  for (const file of inputs(args)) {
    const doc = JSON.parse(fs.readFileSync(file, "utf8"));
    const objs = Array.isArray(doc) ? doc : doc.kind === "List" ? doc.items : [doc];
    for (const obj of objs) {
      const what = `${obj?.kind} ${obj?.metadata?.name}`;
      const r = await validateObject(obj);
      if (r.usage) {
        console.log(`error ${file}: ${what}: ${r.usage}`);
        status = 2;
      } else if (r.errors.length) {
        for (const e of r.errors) console.log(`error ${file}: ${what}: ${e}`);
        status = Math.max(status, 1);
      } else {
        console.log(`ok ${what}`);
      }
    }
  }
  return status;
}

process.exitCode = await main(process.argv.slice(2));
