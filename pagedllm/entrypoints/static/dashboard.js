// Live view of the KV pool: polls /v1/kv every second and redraws the block grid.
"use strict";

const MAX_DRAWN_BLOCKS = 8192;  // beyond this the grid would be too slow to redraw each second
const WASTE_LABELS = {
  used_slots: "slots in used blocks",
  tokens_stored: "tokens stored",
  empty_tail_slots: "empty tail slots (held, not yet filled)",
  empty_tail_fraction: "empty tail fraction (of used slots)",
  token_occupancy: "token occupancy (of the pool)",
  block_occupancy: "block occupancy (of the pool)",
  slots_reserved: "slots reserved (contiguous allocator)",
};

function colourOf(requestId) {
  // FNV-1a, then the golden angle, so ids that differ in one character get far-apart hues.
  let h = 0x811c9dc5;
  for (const ch of requestId) h = Math.imul(h ^ ch.codePointAt(0), 0x01000193) >>> 0;
  return `hsl(${(h * 137.508) % 360}, 65%, ${42 + (h >>> 24) % 16}%)`;
}

function shortId(requestId) {
  return requestId.length > 22 ? `${requestId.slice(0, 9)}…${requestId.slice(-8)}` : requestId;
}

function format(value) {
  if (typeof value !== "number") return JSON.stringify(value);
  return Number.isInteger(value) ? String(value) : value.toFixed(3);
}

function blockElement(block, blockSize) {
  const el = document.createElement("div");
  const shared = block.ref_cnt > 1;
  el.className = `blk ${block.state}${shared ? " shared" : ""}`;
  el.dataset.id = block.id;
  el.dataset.state = block.state;
  el.dataset.ref = block.ref_cnt;
  el.dataset.filled = block.filled;
  el.title = `block ${block.id} · ${block.state} · ref ${block.ref_cnt} · ${block.filled}/${blockSize} slots`
    + (block.owners.length ? ` · ${block.owners.join(", ")}` : "");
  if (block.state === "used") {
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = `${(100 * block.filled) / blockSize}%`;
    fill.style.background = block.owners.length ? colourOf(block.owners[0]) : "#888";
    el.appendChild(fill);
  }
  return el;
}

function drawGrid(snapshot) {
  const grid = document.getElementById("grid");
  const fragment = document.createDocumentFragment();
  for (const block of snapshot.blocks) {
    fragment.appendChild(blockElement(block, snapshot.block_size));
  }
  grid.replaceChildren(fragment);
}

function fillTable(id, rows) {
  const table = document.getElementById(id);
  table.replaceChildren(...rows.map(cells => {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
      tr.appendChild(td);
    }
    return tr;
  }));
}

function swatchLabel(requestId) {
  const span = document.createElement("span");
  const swatch = document.createElement("span");
  swatch.className = "swatch";
  swatch.style.background = colourOf(requestId);
  span.append(swatch, shortId(requestId));
  span.title = requestId;
  return span;
}

function drawSide(snapshot) {
  const waste = Object.entries(snapshot.waste || {}).map(([k, v]) => [WASTE_LABELS[k] || k, format(v)]);
  const cache = snapshot.prefix_cache;
  if (cache) waste.push(["prefix cache hits / queries (tokens)", `${cache.hits_tokens} / ${cache.queries_tokens}`]);
  fillTable("waste", waste);
  const rows = Object.entries(snapshot.requests).map(([id, n]) => [swatchLabel(id), `${n} blocks`]);
  fillTable("requests", rows.length ? rows : [["none", ""]]);
}

function drawCounts(snapshot) {
  const set = (id, value) => { document.getElementById(id).textContent = value; };
  set("running", snapshot.running);
  set("waiting", snapshot.waiting);
  set("used-count", snapshot.counts.used);
  set("shared-count", snapshot.counts.shared);
  set("cached-count", snapshot.counts.cached);
  set("free-count", snapshot.counts.free);
  set("model", snapshot.model || "");
  const drawn = snapshot.num_blocks > MAX_DRAWN_BLOCKS ? ` (first ${MAX_DRAWN_BLOCKS} drawn)` : "";
  set("geometry", `${snapshot.num_blocks} blocks × ${snapshot.block_size} tokens${drawn}`);
  set("updated", new Date().toLocaleTimeString());
}

async function refresh() {
  try {
    // the first blocks only: the counts and per-request figures cover the whole pool
    const response = await fetch(`/v1/kv?limit=${MAX_DRAWN_BLOCKS}`, { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const snapshot = await response.json();
    drawGrid(snapshot);
    drawSide(snapshot);
    drawCounts(snapshot);
    document.getElementById("error").textContent = "";
  } catch (err) {
    document.getElementById("error").textContent = `(${err.message})`;
  } finally {
    setTimeout(refresh, 1000);
  }
}

refresh();
