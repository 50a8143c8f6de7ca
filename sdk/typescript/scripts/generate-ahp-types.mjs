// Generates src/ahp-types.ts, the TypeScript form of AHP 1.0's wire types,
// from the Rust crate `ahp-types` (itself generated from the protocol's
// schema), the same crate the server and the Rust client are built on:
// one source for both languages, so the SDK's types cannot drift from what
// the server speaks.
//
//   node scripts/generate-ahp-types.mjs [path/to/ahp-types/src] > src/ahp-types.ts
//
// Without an argument the crate is found with `cargo metadata` (the
// version in Cargo.lock). `npm run generate` does this; CI runs it and fails
// when the committed file differs.
//
// What the crate's serde attributes say is what is generated: camelCase
// fields, `rename`s, optional fields (`Option` or `default`), tagged unions
// (`tag = "..."`), untagged unions, string enums (the literals their
// `Serialize` writes, plus any other string for values from a newer
// version), numeric enums and aliases.

import { execFileSync } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";

const MODULES = ["common", "state", "actions", "commands", "notifications", "messages", "errors", "version"];

function crateSource() {
  if (process.argv[2]) return process.argv[2];
  const metadata = JSON.parse(
    execFileSync("cargo", ["metadata", "--format-version", "1", "--locked"], {
      cwd: join(dirname(new URL(import.meta.url).pathname), "..", "..", ".."),
      encoding: "utf8",
      maxBuffer: 64 * 1024 * 1024,
    }),
  );
  const found = metadata.packages.find((p) => p.name === "ahp-types");
  if (!found) throw new Error("ahp-types is not in the workspace's dependencies");
  return join(dirname(found.manifest_path), "src");
}

const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

/** A Rust type as TypeScript. */
function tsType(rust) {
  rust = rust.trim().replace(/\s+/g, " ");
  let m;
  if ((m = rust.match(/^Option<(.*)>$/))) return tsType(m[1]);
  if ((m = rust.match(/^Box<(.*)>$/))) return tsType(m[1]);
  if ((m = rust.match(/^Vec<(.*)>$/))) {
    const inner = tsType(m[1]);
    return /[ |&]/.test(inner) ? `Array<${inner}>` : `${inner}[]`;
  }
  if ((m = rust.match(/^(?:std::collections::)?(?:HashMap|BTreeMap|IndexMap)<\s*[^,]+,\s*(.*)>$/))) {
    return `Record<string, ${tsType(m[1])}>`;
  }
  switch (rust) {
    case "String":
    case "str":
    case "&'static str":
      return "string";
    case "bool":
      return "boolean";
    case "serde_json::Value":
      return "unknown";
    case "serde_json::Map<String, serde_json::Value>":
      return "Record<string, unknown>";
    case "()":
      return "null";
  }
  if (/^[iuf](8|16|32|64|128|size)$/.test(rust)) return "number";
  return rust.replace(/^crate::(\w+::)*/, "");
}

/** The doc comment lines just collected, as JSDoc. */
function jsdoc(lines, indent = "") {
  if (!lines.length) return "";
  const body = lines.map((l) => l.replace(/\*\//g, "*\\/"));
  if (body.length === 1) return `${indent}/** ${body[0]} */\n`;
  return `${indent}/**\n${body.map((l) => `${indent} *${l ? " " + l : ""}`).join("\n")}\n${indent} */\n`;
}

function serdeAttr(attrs, key) {
  for (const attr of attrs) {
    const m = attr.match(new RegExp(`${key}\\s*=\\s*"([^"]*)"`));
    if (m && attr.startsWith("#[serde")) return m[1];
  }
  return undefined;
}

const hasSerde = (attrs, word) =>
  attrs.some((a) => a.startsWith("#[serde") && new RegExp(`\\b${word}\\b`).test(a));

/**
 * If `lines[i]` is a doc comment or an attribute (which may span lines),
 * adds it to `docs` or `attrs` and answers the index of its last line;
 * otherwise answers -1.
 */
function annotation(lines, i, docs, attrs) {
  const line = lines[i].trim();
  if (line.startsWith("///")) {
    docs.push(line.replace(/^\/\/\/ ?/, ""));
    return i;
  }
  if (line.startsWith("#[")) {
    let attr = line;
    while (!balanced(attr) && i + 1 < lines.length) attr += " " + lines[++i].trim();
    attrs.push(attr);
    return i;
  }
  return -1;
}

/** Parses the items of one Rust file into declarations. */
function parse(text, out) {
  const lines = text.split("\n");
  let docs = [];
  let attrs = [];
  for (let i = 0; i < lines.length; i++) {
    const end = annotation(lines, i, docs, attrs);
    if (end >= 0) {
      i = end;
      continue;
    }
    const line = lines[i].trim();
    let m;
    if ((m = line.match(/^pub type (\w+)\s*=\s*(.+);$/))) {
      out.push({ kind: "alias", name: m[1], docs, type: tsType(m[2]) });
    } else if ((m = line.match(/^pub struct (\w+)\((?:pub )?(.+)\);$/))) {
      out.push({ kind: "alias", name: m[1], docs, type: tsType(m[2]) });
    } else if ((m = line.match(/^pub struct (\w+)\s*\{\s*\}$/))) {
      out.push({ kind: "struct", name: m[1], docs, fields: [] });
    } else if ((m = line.match(/^pub struct (\w+)\s*\{$/))) {
      const body = [];
      while (lines[++i].trim() !== "}") body.push(lines[i]);
      out.push({ kind: "struct", name: m[1], docs, fields: fields(body, serdeAttr(attrs, "rename_all")) });
    } else if ((m = line.match(/^pub enum (\w+)\s*\{$/))) {
      const body = [];
      let depth = 1;
      while (true) {
        const next = lines[++i];
        depth += (next.match(/\{/g) || []).length - (next.match(/\}/g) || []).length;
        if (depth === 0) break;
        body.push(next);
      }
      const repr = attrs.some((a) => a.includes("Serialize_repr"));
      out.push({
        kind: "enum",
        name: m[1],
        docs,
        repr,
        tag: serdeAttr(attrs, "tag"),
        untagged: hasSerde(attrs, "untagged"),
        derived: attrs.some((a) => a.startsWith("#[derive") && /\bSerialize\b/.test(a)),
        variants: variants(body),
      });
    } else if ((m = line.match(/^impl serde::Serialize for (\w+)\s*\{$/))) {
      const literals = [];
      while (lines[++i] !== "}") {
        const lit = lines[i].match(/serialize_str\("([^"]*)"\)/);
        if (lit) literals.push(lit[1]);
      }
      out.push({ kind: "literals", name: m[1], literals });
    } else if ((m = line.match(/^pub const (\w+): (.+?) = (.+);$/))) {
      out.push({ kind: "const", name: m[1], docs, type: tsType(m[2]), value: m[3] });
    }
    docs = [];
    attrs = [];
  }
}

function balanced(text) {
  let depth = 0;
  for (const c of text) {
    if (c === "[" || c === "(") depth++;
    if (c === "]" || c === ")") depth--;
  }
  return depth === 0;
}

function fields(body, renameAll) {
  const result = [];
  let docs = [];
  let attrs = [];
  for (let i = 0; i < body.length; i++) {
    const end = annotation(body, i, docs, attrs);
    if (end >= 0) {
      i = end;
      continue;
    }
    let decl = body[i].trim();
    while (/^(pub )?\w+:/.test(decl) && !decl.endsWith(",") && i + 1 < body.length) decl += " " + body[++i].trim();
    const m = decl.match(/^(?:pub )?(\w+): (.+),$/);
    if (m) {
      const name = serdeAttr(attrs, "rename") ?? (renameAll === "camelCase" ? camel(m[1]) : m[1]);
      const optional = /^Option</.test(m[2]) || hasSerde(attrs, "default");
      result.push({ name, docs, optional, type: tsType(m[2]) });
    }
    docs = [];
    attrs = [];
  }
  return result;
}

function variants(body) {
  const result = [];
  let docs = [];
  let attrs = [];
  for (let i = 0; i < body.length; i++) {
    const end = annotation(body, i, docs, attrs);
    if (end >= 0) {
      i = end;
      continue;
    }
    const line = body[i].trim();
    let m;
    const rename = serdeAttr(attrs, "rename");
    const untagged = hasSerde(attrs, "untagged");
    if ((m = line.match(/^(\w+)\((.+)\),$/))) {
      result.push({ name: m[1], rename, untagged, docs, payload: tsType(m[2]) });
    } else if ((m = line.match(/^(\w+)\s*\{(.+)\},?$/))) {
      // A struct variant on one line: `Name { a: A, b: B },`.
      const inline = m[2].split(",").map((f) => f.trim()).filter(Boolean).map((f) => `pub ${f},`);
      result.push({ name: m[1], rename, untagged, docs, fields: fields(inline, "camelCase") });
    } else if ((m = line.match(/^(\w+)\s*\{$/))) {
      const inner = [];
      while (!/^\},?$/.test(body[++i].trim())) inner.push(body[i]);
      result.push({ name: m[1], rename, untagged, docs, fields: fields(inner, "camelCase") });
    } else if ((m = line.match(/^(\w+)(?:\s*=\s*(-?\d+))?,$/))) {
      result.push({ name: m[1], rename, untagged, docs, value: m[2] });
    }
    docs = [];
    attrs = [];
  }
  return result;
}

function renderFields(list, indent) {
  return list
    .map((f) => `${jsdoc(f.docs, indent)}${indent}${/^\w+$/.test(f.name) ? f.name : JSON.stringify(f.name)}${f.optional ? "?" : ""}: ${f.type};`)
    .join("\n");
}

function render(decls) {
  const literals = new Map(decls.filter((d) => d.kind === "literals").map((d) => [d.name, d.literals]));
  const parts = [];
  for (const d of decls) {
    if (d.kind === "alias") {
      parts.push(`${jsdoc(d.docs)}export type ${d.name} = ${d.type};`);
    } else if (d.kind === "const") {
      if (d.type === "string" || d.type === "number") parts.push(`${jsdoc(d.docs)}export const ${d.name}: ${d.type} = ${d.value};`);
    } else if (d.kind === "struct") {
      const body = d.fields.length ? `{\n${renderFields(d.fields, "  ")}\n}` : "{}";
      parts.push(`${jsdoc(d.docs)}export interface ${d.name} ${body}`);
    } else if (d.kind === "enum") {
      parts.push(`${jsdoc(d.docs)}export type ${d.name} =\n${renderEnum(d, literals.get(d.name))};`);
    }
  }
  return parts.join("\n\n");
}

function renderEnum(d, literals) {
  if (d.repr) return d.variants.map((v) => `  | ${v.value}`).join("\n");
  if (literals) {
    // A string enum: its known values, and any string from a newer version.
    return [...literals.map((l) => `  | ${JSON.stringify(l)}`), "  | (string & {})"].join("\n");
  }
  // A tagged union's raw `Unknown(serde_json::Value)` arm (values from a
  // newer version) is left out: in TypeScript it would swallow the union.
  const known = d.variants.filter((v) => !(d.tag && v.payload === "unknown"));
  const unit = (v) => v.payload === undefined && !v.fields;
  if (!d.tag && !d.untagged && known.every(unit)) {
    // Unit variants only: the strings serde writes for them.
    return known.map((v) => `  | ${JSON.stringify(v.rename ?? v.name)}`).join("\n");
  }
  const arms = known.map((v) => {
    let shape;
    if (v.payload !== undefined) shape = v.payload;
    else if (v.fields) shape = `{\n${renderFields(v.fields, "      ")}\n    }`;
    else shape = undefined;
    if (d.untagged || v.untagged || !d.tag) return `  | ${shape ?? "null"}`;
    const tag = `{ ${d.tag}: ${JSON.stringify(v.rename ?? v.name)} }`;
    return shape === undefined ? `  | ${tag}` : `  | (${tag} & ${shape})`;
  });
  return arms.join("\n");
}

const source = crateSource();
const decls = [];
const present = new Set(readdirSync(source));
for (const module of MODULES) {
  if (present.has(`${module}.rs`)) parse(readFileSync(join(source, `${module}.rs`), "utf8"), decls);
}
const version = source.match(/ahp-types-([\d.]+)/)?.[1] ?? "unknown";
process.stdout.write(
  `// AHP wire types, generated by scripts/generate-ahp-types.mjs from the Rust\n` +
    `// crate ahp-types ${version}. Do not edit; run \`npm run generate\`.\n` +
    `/* eslint-disable */\n\n` +
    `export type JsonValue = unknown;\n\n` +
    render(decls) +
    "\n",
);
