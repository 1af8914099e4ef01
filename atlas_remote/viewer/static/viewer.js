// atlas-remote view: the page, built from the server's JSON with textContent only. Nothing from a dataset is
// ever parsed as HTML: no innerHTML, no inline handlers, images only from data: URLs the server made.
"use strict";

(function () {
  const FOLD = 300; // characters of text shown before it is folded
  const NUMBERS_SHOWN = 16; // an array's first values shown before the rest is folded
  const state = { start: 0, perPage: 20, examples: 0, present: 0 };
  const byId = (id) => document.getElementById(id);

  function el(tag, options, children) {
    const node = document.createElement(tag);
    const o = options || {};
    if (o.cls) node.className = o.cls;
    if (o.text !== undefined) node.textContent = String(o.text);
    if (o.title) node.title = String(o.title);
    for (const child of children || []) if (child) node.appendChild(child);
    return node;
  }

  const count = (n) => Number(n).toLocaleString("en-US");

  function size(n) {
    if (n === null || n === undefined) return "unknown";
    const units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let value = Number(n), unit = 0;
    while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
    return unit === 0 ? `${count(n)} bytes` : `${value.toFixed(1)} ${units[unit]} (${count(n)} bytes)`;
  }

  async function ask(path) {
    const response = await fetch(path, { headers: { Accept: "application/json" } });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
    if (body.cost) byId("total-cost").textContent = `requests to the store since the dataset was opened: ${count(body.cost.total_requests)}`;
    return body;
  }

  function costText(what, cost) {
    const kinds = Object.entries(cost.by_kind).map(([k, n]) => `${k} ${n}`).join(", ");
    return `${what}: ${count(cost.requests)} request${cost.requests === 1 ? "" : "s"}` +
      (kinds ? ` (${kinds})` : "") + `, ${count(cost.bytes)} bytes, ${Math.round(cost.seconds * 1000)} ms`;
  }

  // -- values ------------------------------------------------------------------------------------------

  function image(src, alt) {
    if (typeof src !== "string" || !src.startsWith("data:image/")) return null; // only what the server encoded
    const img = el("img", { cls: "v-image" });
    img.alt = alt;
    img.src = src;
    return img;
  }

  function text(v) {
    const full = v.text;
    const cut = v.length > full.length ? el("span", { cls: "v-meta", text: ` (first ${count(full.length)} of ${count(v.length)} characters)` }) : null;
    if (full.length <= FOLD && full.split("\n").length <= 8 && !cut) return el("span", { cls: "v-str", text: full });
    return el("details", { cls: "v-fold" }, [
      el("summary", {}, [
        el("span", { cls: "v-str", text: full.slice(0, 120) + "…" }),
        el("span", { cls: "v-meta", text: ` ${count(v.length)} characters` }),
      ]),
      el("span", { cls: "v-str", text: full }),
      cut,
    ]);
  }

  function array(v) {
    const label = `${v.type === "torch.Tensor" ? "tensor" : "array"} ${v.dtype} (${v.shape.join(", ")})`;
    if (v.image) {
      const note = v.subsampled > 1 ? `, every ${v.subsampled}th pixel` : "";
      return el("div", {}, [el("span", { cls: "v-meta", text: label + note }), image(v.image, label)]);
    }
    const meta = el("span", { cls: "v-meta", text: v.tokens ? `${label}, tokens` : label });
    const more = v.size > v.values.length ? ", …" : "";
    if (v.values.length <= NUMBERS_SHOWN) return el("div", {}, [meta, el("span", { cls: "v-numbers", text: `[${v.values.join(", ")}${more}]` })]);
    const rest = v.size > v.values.length ? ` (the first ${count(v.values.length)} of ${count(v.size)})` : "";
    return el("div", {}, [meta, el("details", { cls: "v-fold" }, [
      el("summary", { cls: "v-numbers", text: `[${v.values.slice(0, NUMBERS_SHOWN).join(", ")}, …] ${count(v.size)} values` }),
      el("span", { cls: "v-numbers", text: `[${v.values.join(", ")}${more}]${rest}` }),
    ])]);
  }

  function bytes(v) {
    const label = `${count(v.length)} bytes` + (v.mime ? `, ${v.mime}` : "");
    const picture = v.image ? image(v.image, label) : null;
    if (picture) return el("div", {}, [el("span", { cls: "v-meta", text: label }), picture]);
    return el("div", {}, [
      el("span", { cls: "v-meta", text: label + (v.mime ? " (too large to show)" : "") }),
      el("span", { cls: "v-bytes", text: `b'${v.text}'` + (v.length > 64 ? "…" : "") }),
    ]);
  }

  function container(v, depth) {
    const isDict = v.kind === "dict";
    if (v.length === 0) return el("span", { cls: "v-other", text: `${v.type} (empty)` });
    const items = el("div", { cls: "v-items" });
    for (const item of v.items) {
      const row = el("div", { cls: "v-item" });
      if (isDict) row.appendChild(el("span", { cls: "v-key", text: item[0] }));
      row.appendChild(value(isDict ? item[1] : item, depth + 1));
      items.appendChild(row);
    }
    if (v.length > v.items.length) items.appendChild(el("div", { cls: "v-meta", text: `… ${count(v.length - v.items.length)} more` }));
    const fold = el("details", {}, [el("summary", { text: `${v.type}, ${count(v.length)} ${isDict ? "keys" : "items"}` }), items]);
    fold.open = depth <= 1 && v.length <= 8;
    return fold;
  }

  function value(v, depth) {
    if (v === null) return el("span", { cls: "v-meta", text: "(no such key)" });
    switch (v.kind) {
      case "none": case "bool": case "int": case "float":
        return el("span", { cls: `v-${v.kind}`, text: v.text, title: v.type });
      case "str": return text(v);
      case "bytes": return bytes(v);
      case "array": return array(v);
      case "dict": case "list": return container(v, depth);
      default: return el("span", { cls: "v-other", text: `${v.type}: ${v.text}` });
    }
  }

  // -- the dataset at a glance -------------------------------------------------------------------------

  function fact(name, text, id) {
    const dd = el("dd", { text });
    if (id) dd.id = id;
    byId("facts").append(el("dt", { text: name }), dd);
  }

  async function showSummary() {
    const s = await ask("api/summary");
    state.examples = s.examples;
    state.present = s.shards_present;
    byId("url").textContent = s.url;
    document.title = `${s.url} - atlas-remote view`;
    if (s.facts) { // a Megatron corpus: its facts as the server words them
      for (const [name, text] of s.facts) fact(name, text);
      byId("summary-cost").textContent = costText("this summary", s.cost);
      return;
    }
    const missing = s.examples_in_root - s.examples;
    fact("examples", count(s.examples) + (missing ? ` of ${count(s.examples_in_root)} (some shards missing)` : ""));
    fact("shards", `${count(s.shards_present)} of ${count(s.shards)} present`);
    fact("strategy", s.compression_strategy);
    fact("block size", s.block_sizes.length ? s.block_sizes.map(count).join(", ") + " examples" : "known when a shard is opened");
    fact("stored", size(s.bytes_stored));
    fact("decoded", s.decoded_estimate ? `about ${size(s.decoded_estimate)}` : "estimated from a sample (below)", "decoded");
    fact("checksums", s.shards_with_checksums === s.shards_present ? "every shard (CRC-32 per block, checked on every read)" : `${count(s.shards_with_checksums)} of ${count(s.shards_present)} shards`);
    fact("manifest", s.manifest ? "yes (opens in a few requests whatever its shards)" : "no (`atlas-remote index URL` writes one)");
    fact("written by", s.written_by);
    fact("reads via", s.read_client);
    byId("summary-cost").textContent = costText("this summary", s.cost);
  }

  // -- examples ----------------------------------------------------------------------------------------

  async function showPage(start) {
    const error = byId("page-error");
    let page;
    try {
      page = await ask(`api/examples?start=${start}&count=${state.perPage}`);
    } catch (err) {
      error.textContent = String(err.message || err);
      error.hidden = false;
      return;
    }
    error.hidden = true;
    state.start = page.start;
    state.examples = page.examples;
    history.replaceState(null, "", `#start=${page.start}`);
    const head = byId("examples").tHead, body = byId("examples").tBodies[0];
    head.replaceChildren(el("tr", {}, [el("th", { text: "#" }), ...(page.columns || ["example"]).map((c) => el("th", { text: c }))]));
    body.replaceChildren();
    const width = (page.columns || [0]).length;
    for (const row of page.rows) {
      const tr = el("tr", {}, [el("td", { cls: "index", text: count(row.index) })]);
      tr.dataset.index = String(row.index);
      if (row.error !== undefined) {
        const td = el("td", { cls: "refused", text: row.error });
        td.colSpan = width;
        tr.appendChild(td);
      } else if (row.cells) {
        for (const cell of row.cells) tr.appendChild(el("td", {}, [value(cell, 1)]));
      } else {
        tr.appendChild(el("td", {}, [value(row.value, 0)]));
      }
      body.appendChild(tr);
    }
    byId("position").textContent = `examples ${count(page.start)}–${count(page.stop - 1)} of ${count(page.examples)}`;
    byId("prev").disabled = page.start === 0;
    byId("next").disabled = page.stop >= page.examples;
    byId("page-cost").textContent = costText("this page", page.cost);
  }

  // -- charts ------------------------------------------------------------------------------------------

  const INTEGER_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];

  // Bars from 0, each centred on its x (histogram: starting at its bin's left edge), none cut at the ends.
  function chart(title, xs, ys, xLabel, yLabel, histogram) {
    const box = el("div", { cls: "chart" }, [el("h3", { text: title })]);
    byId("charts").appendChild(box);
    if (typeof uPlot === "undefined" || !xs.length) {
      box.appendChild(el("p", { cls: "v-meta", text: xs.length ? "(charting library not loaded)" : "(nothing to draw)" }));
      return;
    }
    let step = Infinity;
    for (let i = 1; i < xs.length; i++) step = Math.min(step, xs[i] - xs[i - 1]);
    if (!Number.isFinite(step) || step <= 0) step = 1;
    const low = histogram ? xs[0] : xs[0] - step / 2, high = xs[xs.length - 1] + (histogram ? step : step / 2);
    const bars = uPlot.paths.bars({ size: [0.9, 60], align: histogram ? 1 : 0 });
    new uPlot({
      width: 460, height: 220,
      scales: { x: { time: false, range: () => [low, high] }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1] } },
      axes: [histogram ? { label: xLabel } : { label: xLabel, incrs: INTEGER_STEPS }, { label: yLabel, size: 70 }],
      series: [{ label: xLabel }, { label: yLabel, stroke: "#3867b5", fill: "rgba(56,103,181,0.35)", paths: bars, points: { show: false } }],
    }, [xs, ys], box);
  }

  async function showPlots() {
    const shards = await ask("api/shards");
    const [unit, file] = shards.names ? ["documents", "file"] : ["examples", "shard"]; // a Megatron corpus: its files
    chart(`${unit[0].toUpperCase() + unit.slice(1)} per ${file}`, shards.numbers, shards.examples, file, unit);
    chart(`Stored bytes per ${file} (${shards.names ? ".bin" : "data.bin"})`, shards.numbers, shards.bytes, file, "bytes");
    let cost = shards.cost.requests, spent = shards.cost.bytes;
    const sample = await ask("api/sample");
    if (sample.lengths) { // a Megatron corpus: every document's length, from its .idx
      const h = sample.lengths, t = sample.tokens;
      chart("Document lengths (tokens, every document)", h.counts.map((_, i) => h.edges[i]), h.counts, "tokens", "documents", true);
      byId("sample-note").textContent = `${count(sample.documents)} documents` +
        (t ? `: ${count(t.min)} to ${count(t.max)} tokens, median ${count(t.median)}` : "") + " (from the .idx; nothing read).";
      byId("plots-cost").textContent = `these charts: ${count(cost + sample.cost.requests)} requests, ${count(spent + sample.cost.bytes)} bytes`;
      return;
    }
    cost += sample.cost.requests;
    spent += sample.cost.bytes;
    const blocks = sample.blocks;
    chart("Compression ratio of the sampled shards (decoded ÷ stored)", blocks.map((b) => b.shard), blocks.map((b) => b.decoded / b.stored), "shard", "ratio");
    const h = sample.histogram;
    chart("Example sizes in the sample (pickled bytes)", h.counts.map((_, i) => h.edges[i]), h.counts, "bytes", "examples", true);
    const docs = sample.documents;
    if (docs) {
      const d = docs.histogram;
      chart(`Document lengths in the sample (tokens under ${JSON.stringify(docs.key)})`, d.counts.map((_, i) => d.edges[i]), d.counts, "tokens", "documents", true);
    }
    const spread = sample.example_bytes;
    byId("sample-note").textContent =
      `Sampled: the middle block of ${count(sample.shards_sampled)} of ${count(state.present)} shards (evenly spaced), ` +
      `${count(sample.examples_sampled)} examples` +
      (spread ? `: ${count(spread.min)} to ${count(spread.max)} bytes pickled, median ${count(spread.median)}` : "") +
      (docs ? `; documents of ${count(docs.tokens.min)} to ${count(docs.tokens.max)} tokens, median ${count(docs.tokens.median)}` : "") +
      (sample.ratio ? `; decoded ÷ stored ${sample.ratio}` : "") +
      (sample.errors.length ? `; ${sample.errors.length} block(s) refused: ${sample.errors[0]}` : "") + ".";
    if (sample.decoded_estimate) byId("decoded").textContent = `about ${size(sample.decoded_estimate)} (stored × the sample's ratio, ${sample.ratio})`;
    byId("plots-cost").textContent = `these charts: ${count(cost)} requests, ${count(spent)} bytes`;
  }

  // -- wiring ------------------------------------------------------------------------------------------

  function startFromHash() {
    const match = /start=(\d+)/.exec(location.hash);
    return match ? Number(match[1]) : 0;
  }

  async function main() {
    byId("prev").addEventListener("click", () => showPage(Math.max(0, state.start - state.perPage)));
    byId("next").addEventListener("click", () => showPage(state.start + state.perPage));
    byId("per-page").addEventListener("change", (e) => { state.perPage = Number(e.target.value); showPage(state.start); });
    window.addEventListener("hashchange", () => { if (startFromHash() !== state.start) showPage(startFromHash()); });
    byId("goto").addEventListener("submit", (e) => { e.preventDefault(); showPage(Number(byId("index").value)); });
    const summary = showSummary(); // asked together with the first page (the server answers one at a time)
    await showPage(startFromHash());
    try {
      await summary;
    } catch (err) {
      const error = byId("page-error");
      error.textContent = String(err.message || err);
      error.hidden = false;
      return;
    }
    try {
      await showPlots();
    } catch (err) {
      byId("sample-note").textContent = String(err.message || err);
    }
  }

  document.addEventListener("DOMContentLoaded", main);
})();
