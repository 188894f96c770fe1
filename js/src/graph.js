// The interactive graph of the data xlakit/notebook/graph_widget.py makes
// (inputs and nodes in a tree of module groups). Each open group is laid out
// by dagre on its own, its open subgroups as boxes of their own layout's size,
// the way Model Explorer and TensorBoard draw nested graphs: opening or
// closing a group lays out only it and the groups around it, so graphs of
// thousands of nodes stay quick.
import { Graph, layout } from "@dagrejs/dagre";
import { select } from "d3-selection";
import { zoom, zoomIdentity, zoomTransform } from "d3-zoom";

import CSS from "./graph.css";

const SVG = "http://www.w3.org/2000/svg";
const CHAR_W = 6.6; // px per character of the 11px monospace font
const LINE_H = 13;
const PAD = 8;
const HEADER = 20;
const MARKS = ["donated", "output", "split", "changed"];
// The canvas is as tall as the graph at its first view, between these: a 4-node step's graph
// had the same 620 px canvas as a GPT-2 step's, mostly empty
const MIN_HEIGHT = 180, MAX_HEIGHT = 620, MARGIN = 8;

function svg(tag, attrs, parent) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function html(tag, className, parent, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function cut(text, width) {
  return text.length <= width ? text : text.slice(0, width - 1) + "…";
}

// The tree and, per group, the edges between its direct children (an edge
// between two items is drawn once, in the deepest group holding both).
class Model {
  constructor(data) {
    this.items = data.items;
    this.groups = data.groups;
    this.depth = this.groups.map(() => 0);
    this.groups.forEach((g, i) => { if (i > 0) this.depth[i] = this.depth[g.parent] + 1; });
    this.edges = this.groups.map(() => new Map());
    // a graph that was never lowered (explain's FX graphs) has no HLO to show for any node
    this.hasHlo = this.items.some((item) => item.hlo && item.hlo.length);
    this.items.forEach((item, k) => (item.preds || []).forEach((p) => this.addEdge(p, k)));
    // per group: how many ops and inputs it holds, and how many carry each mark
    this.counts = this.groups.map(() => ({ node: 0, input: 0 }));
    this.items.forEach((item) => {
      for (const g of this.ancestors(item.group)) {
        const counts = this.counts[g];
        counts[item.kind] += 1;
        for (const m of MARKS) if (item[m]) counts[m] = (counts[m] || 0) + 1;
      }
    });
  }

  addEdge(from, to) {
    let a = this.items[from].group, b = this.items[to].group;
    let ka = "i" + from, kb = "i" + to;
    while (a !== b) {
      if (this.depth[a] >= this.depth[b]) { ka = "g" + a; a = this.groups[a].parent; }
      else { kb = "g" + b; b = this.groups[b].parent; }
    }
    if (ka === kb) return;
    const key = ka + " " + kb;
    this.edges[a].set(key, (this.edges[a].get(key) || 0) + 1);
  }

  ancestors(g) {
    const chain = [];
    for (; g !== null && g !== undefined; g = this.groups[g].parent) chain.push(g);
    return chain;
  }
}

class GraphView {
  constructor(el, data) {
    this.el = el;
    el.classList.add("xlakit-graph-widget");
    html("style", null, el, CSS);
    const bar = html("div", "xg-bar", el);
    this.search = html("input", "xg-search", bar);
    this.search.placeholder = "search op, source or module";
    this.found = html("span", "xg-found", bar);
    for (const [label, action] of [["next", () => this.next(1)], ["previous", () => this.next(-1)],
                                   ["fit", () => this.fit()], ["close all", () => this.closeAll()]]) {
      html("button", "xg-button", bar, label).addEventListener("click", action);
    }
    this.search.addEventListener("input", () => this.find(this.search.value));
    this.search.addEventListener("keydown", (e) => { if (e.key === "Enter") this.next(e.shiftKey ? -1 : 1); });
    const main = this.main = html("div", "xg-main", el);
    this.canvas = svg("svg", { class: "xg-canvas xlakit-graph" }, main);
    this.root = svg("g", {}, this.canvas);
    this.details = html("div", "xg-details", main);
    const legend = html("div", "xg-legend", el);
    for (const m of ["input", "donated", "output", "split", "changed", "match"]) {
      html("span", "xg-swatch " + m, legend);
      html("span", null, legend, m === "split" ? "graph split" : m === "changed" ? "changed since last step" : m);
    }
    this.zoom = zoom().scaleExtent([0.05, 4]).on("zoom", (e) => {
      this.root.setAttribute("transform", e.transform);
      el.dataset.scale = e.transform.k; // for tests: the text's size is 11 px times this
    });
    select(this.canvas).call(this.zoom).on("dblclick.zoom", null);
    // a tab not yet shown has no size: place the graph once it has one
    this.resize = new ResizeObserver(() => { if (!this.placed) this.placed = this.place(); });
    this.resize.observe(this.canvas);
    this.setData(data);
  }

  setData(data) {
    this.model = new Model(data);
    this.open = new Set(data.expanded);
    this.opened = data.opened || [];
    this.layouts = new Map();
    this.matches = [];
    this.at = -1;
    this.selected = null;
    this.showDetails(null);
    this.draw();
    this.placed = this.place();
  }

  // -- layout --------------------------------------------------------------
  itemSize(item) {
    const lines = this.itemLines(item);
    return { width: Math.max(...lines.map((l) => l.length)) * CHAR_W + 2 * PAD, height: lines.length * LINE_H + 10 };
  }

  itemLines(item) {
    const source = (item.library || item.user || "").split(" in ")[0];
    return [cut(item.title, 30), cut((item.avals || []).join(", "), 30), cut(source, 30)].filter((l) => l);
  }

  groupLines(g) {
    const counts = this.model.counts[g];
    const size = `${counts.node} ops` + (counts.input ? `, ${counts.input} inputs` : "");
    return [cut("▸ " + this.model.groups[g].label, 30), size,
            ...["donated", "changed"].filter((m) => counts[m]).map((m) => `${counts[m]} ${m}`)];
  }

  layoutOf(g) {
    if (this.layouts.has(g)) return this.layouts.get(g);
    const group = this.model.groups[g];
    const graph = new Graph();
    graph.setGraph({ rankdir: "TB", nodesep: 12, ranksep: 22, marginx: PAD, marginy: PAD });
    graph.setDefaultEdgeLabel(() => ({}));
    for (const k of group.items) {
      const size = this.itemSize(this.model.items[k]);
      graph.setNode("i" + k, size);
    }
    for (const c of group.groups) {
      if (this.open.has(c)) {
        const inner = this.layoutOf(c);
        graph.setNode("g" + c, { width: Math.max(inner.width, this.model.groups[c].label.length * CHAR_W + 40),
                                 height: inner.height + HEADER });
      } else {
        const lines = this.groupLines(c);
        graph.setNode("g" + c, { width: Math.max(...lines.map((l) => l.length)) * CHAR_W + 2 * PAD,
                                 height: lines.length * LINE_H + 10 });
      }
    }
    const linked = new Set();
    for (const [key, count] of this.model.edges[g]) {
      const [a, b] = key.split(" ");
      graph.setEdge(a, b, { count });
      linked.add(a).add(b);
    }
    // Boxes with no edge here (a group's inputs) would all take the first rank,
    // in one row as wide as they are many: stack them in columns instead.
    const loose = graph.nodes().filter((key) => !linked.has(key));
    const column = Math.ceil(Math.sqrt(loose.length));
    for (let i = 1; loose.length > 6 && i < loose.length; i++) {
      if (i % column) graph.setEdge(loose[i - 1], loose[i], { hidden: true, minlen: 1 });
    }
    layout(graph);
    const result = { width: graph.graph().width, height: graph.graph().height, nodes: new Map(), edges: [] };
    for (const key of graph.nodes()) {
      const n = graph.node(key);
      result.nodes.set(key, { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, height: n.height });
    }
    for (const e of graph.edges()) {
      const label = graph.edge(e);
      if (!label.hidden) result.edges.push({ from: e.v, to: e.w, count: label.count, points: label.points });
    }
    this.layouts.set(g, result);
    return result;
  }

  // -- drawing -------------------------------------------------------------
  draw() {
    this.root.replaceChildren();
    this.boxes = new Map(); // "i12" / "g3" -> its <g>, for search and selection
    this.drawGroup(0, 0, 0, this.root);
    this.markMatches();
    this.el.dataset.boxes = this.root.querySelectorAll(".xg-box").length; // for tests and bench/render.py
  }

  drawGroup(g, ox, oy, parent) {
    const lay = this.layoutOf(g);
    const layer = svg("g", { transform: `translate(${ox},${oy})` }, parent);
    for (const e of lay.edges) {
      const d = e.points.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join("");
      const path = svg("path", { d, class: "xg-edge" + (e.count > 1 ? " many" : "") }, layer);
      if (e.count > 1) svg("title", {}, path).textContent = `${e.count} edges`;
    }
    for (const [key, box] of lay.nodes) {
      const index = Number(key.slice(1));
      if (key[0] === "i") this.drawItem(index, box, layer);
      else if (this.open.has(index)) this.drawOpenGroup(index, box, layer);
      else this.drawClosedGroup(index, box, layer);
    }
  }

  drawItem(k, box, layer) {
    const item = this.model.items[k];
    const classes = ["xg-box", "xlakit-node", item.kind, ...MARKS.filter((m) => item[m])];
    const node = svg("g", { class: classes.join(" "), "data-item": k, transform: `translate(${box.x},${box.y})` }, layer);
    svg("rect", { width: box.width, height: box.height, rx: 4 }, node);
    this.itemLines(item).forEach((line, i) => {
      svg("text", { x: PAD, y: 14 + i * LINE_H }, node).textContent = line;
    });
    svg("title", {}, node).textContent = [item.title, item.module, item.user, item.library].filter((t) => t).join("\n");
    node.addEventListener("click", (e) => { e.stopPropagation(); this.select(k); });
    this.boxes.set("i" + k, node);
  }

  drawClosedGroup(g, box, layer) {
    const counts = this.model.counts[g];
    const classes = ["xg-box", "xlakit-node", "group", "closed", ...MARKS.filter((m) => counts[m])];
    const node = svg("g", { class: classes.join(" "), "data-group": g, transform: `translate(${box.x},${box.y})` },
                     layer);
    svg("rect", { width: box.width, height: box.height, rx: 6 }, node);
    this.groupLines(g).forEach((line, i) => {
      svg("text", { x: PAD, y: 14 + i * LINE_H, class: i ? "" : "xg-label" }, node).textContent = line;
    });
    svg("title", {}, node).textContent = `${this.model.groups[g].name || "graph"}: click to open`;
    node.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(g); });
    this.boxes.set("g" + g, node);
  }

  drawOpenGroup(g, box, layer) {
    const group = this.model.groups[g];
    const frame = svg("g", { class: `xg-frame depth${this.model.depth[g] % 4}`, "data-group": g,
                             transform: `translate(${box.x},${box.y})` }, layer);
    svg("rect", { width: box.width, height: box.height, rx: 6 }, frame);
    const header = svg("g", { class: "xg-header" }, frame);
    svg("rect", { width: box.width, height: HEADER, rx: 6, class: "xg-header-bg" }, header);
    svg("text", { x: PAD, y: 14, class: "xg-label" }, header).textContent = "▾ " + group.label;
    svg("title", {}, header).textContent = `${group.name}: click to close`;
    header.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(g); });
    this.boxes.set("g" + g, frame);
    this.drawGroup(g, box.x, box.y + HEADER, layer);
  }

  // Open or close group g. A closed group's box stays where the group was on
  // the screen; an opened group is shown whole (down to a legible size).
  // Then the view is re-centred: a graph that fits is centred, a larger one kept from panning
  // past its edges, and the group's box and its parent's title are kept in sight.
  toggle(g) {
    const before = this.boxes.get("g" + g).getBoundingClientRect();
    if (this.open.has(g)) this.open.delete(g);
    else this.open.add(g);
    for (const a of this.model.ancestors(g)) this.layouts.delete(a);
    this.draw();
    const lay = this.layoutOf(0);
    const t = zoomTransform(this.canvas);
    this.setHeight(lay.height * t.k);
    const after = this.boxes.get("g" + g).getBoundingClientRect();
    const canvas = this.canvas.getBoundingClientRect();
    const view = this.visibleArea();
    // the box's top-left corner in graph coordinates, and where on the canvas it goes
    const gx = (after.left - canvas.left - t.x) / t.k, gy = (after.top - canvas.top - t.y) / t.k;
    const gw = after.width / t.k, gh = after.height / t.k;
    let k = t.k, x = before.left - canvas.left, y = before.top - canvas.top;
    if (this.open.has(g)) {
      k = Math.max(0.3, Math.min(1, (view.width - 2 * MARGIN) / gw, (view.height - 2 * MARGIN) / gh));
      x = (view.width - gw * k) / 2;
      y = Math.min(y, view.height - gh * k - MARGIN);
    }
    let tx = x - gx * k, ty = y - gy * k;
    // the parent's title above the group, where the box stays in sight below it
    const parent = this.model.groups[g].parent;
    if (parent) {
      const top = this.frameTop(parent);
      if (ty + top * k < MARGIN && MARGIN + (gy + gh - top) * k <= view.height) ty = MARGIN - top * k;
    }
    [tx, ty] = this.clamp(tx, ty, k, lay, view);
    select(this.canvas).call(this.zoom.transform, zoomIdentity.translate(tx, ty).scale(k));
  }

  // where group g's frame starts, in the root's coordinates
  frameTop(g) {
    const parentOf = (c) => this.model.groups[c].parent;
    let top = this.layoutOf(parentOf(g)).nodes.get("g" + g).y;
    for (let a = parentOf(g); a; a = parentOf(a)) top += this.layoutOf(parentOf(a)).nodes.get("g" + a).y + HEADER;
    return top;
  }

  // a translation that centres an axis the graph fits in, and keeps a longer one from leaving a gap
  clamp(tx, ty, k, lay, view) {
    const axis = (t, size, room) => (size * k + 2 * MARGIN <= room ? (room - size * k) / 2
      : Math.min(MARGIN, Math.max(room - size * k - MARGIN, t)));
    return [axis(tx, lay.width, view.width), axis(ty, lay.height, view.height)];
  }

  closeAll() {
    this.open = new Set([0]);
    this.layouts.clear();
    this.draw();
    this.fit();
  }

  // -- view ----------------------------------------------------------------
  // The part of the canvas the details panel leaves (the panel may lie over it).
  visibleArea() {
    const canvas = this.canvas.getBoundingClientRect(), panel = this.details.getBoundingClientRect();
    const right = panel.width && panel.left < canvas.right ? Math.max(canvas.left, panel.left) : canvas.right;
    return { width: right - canvas.left, height: canvas.height };
  }

  setHeight(graphHeight) {
    const height = Math.max(MIN_HEIGHT, Math.min(MAX_HEIGHT, Math.ceil(graphHeight + 2 * MARGIN)));
    this.main.style.height = `${height}px`; // the details panel scrolls in it, the canvas fills it
  }

  // The first view: the groups opened last closed while the graph is larger than the canvas can
  // show at its full size (11 px text), the canvas as tall as it, the graph fitted in it.
  place() {
    const { width } = this.visibleArea();
    if (!width) return false;
    let lay = this.layoutOf(0);
    for (let u = this.opened.length - 1; u >= 0 && (lay.width + 2 * MARGIN > width
                                                   || lay.height + 2 * MARGIN > MAX_HEIGHT); u--) {
      for (const g of this.opened[u]) {
        this.open.delete(g);
        for (const a of this.model.ancestors(g)) this.layouts.delete(a);
      }
      lay = this.layoutOf(0);
    }
    this.draw();
    return this.fit();
  }

  // The whole graph, at most at its full size, centred in the canvas made as tall as it needs.
  fit() {
    const lay = this.layoutOf(0);
    const { width } = this.visibleArea();
    if (!width) return false;
    this.setHeight(lay.height);
    const { height } = this.visibleArea();
    const k = Math.max(0.05, Math.min(1, (width - 2 * MARGIN) / lay.width, (height - 2 * MARGIN) / lay.height));
    this.setHeight(lay.height * k);
    const [x, y] = this.clamp(0, 0, k, lay, this.visibleArea());
    select(this.canvas).call(this.zoom.transform, zoomIdentity.translate(x, y).scale(k));
    return true;
  }

  centerOn(node) {
    const box = node.getBBox();
    const ctm = node.getCTM(), rootCtm = this.root.getCTM();
    if (!ctm || !rootCtm) return;
    const local = rootCtm.inverse().multiply(ctm);
    const cx = local.e + box.width / 2, cy = local.f + box.height / 2;
    const { width, height } = this.canvas.getBoundingClientRect();
    const scale = Math.max(0.6, Math.min(1.2, zoomTransform(this.canvas).k));
    select(this.canvas).call(this.zoom.transform,
                             zoomIdentity.translate(width / 2 - cx * scale, height / 2 - cy * scale).scale(scale));
  }

  // -- search --------------------------------------------------------------
  find(query) {
    const q = query.trim().toLowerCase();
    this.matches = !q ? [] : this.model.items.flatMap((item, k) =>
      [item.title, item.op, item.user, item.library, item.module].some((t) => t && t.toLowerCase().includes(q))
        ? [k] : []);
    this.at = -1;
    this.found.textContent = q ? `${this.matches.length} found` : "";
    this.markMatches();
  }

  markMatches() {
    for (const node of this.root.querySelectorAll(".match")) node.classList.remove("match");
    for (const k of this.matches) {
      // the item's box if shown, else the closed group that holds it
      for (const g of [null, ...this.model.ancestors(this.model.items[k].group)]) {
        const node = this.boxes.get(g === null ? "i" + k : "g" + g);
        if (node && (g === null || !this.open.has(g))) { node.classList.add("match"); break; }
      }
    }
  }

  next(step) {
    if (!this.matches.length) return;
    this.at = (this.at + step + this.matches.length) % this.matches.length;
    const k = this.matches[this.at];
    let changed = false;
    for (const g of this.model.ancestors(this.model.items[k].group)) {
      if (!this.open.has(g)) { this.open.add(g); changed = true; for (const a of this.model.ancestors(g)) this.layouts.delete(a); }
    }
    if (changed) this.draw();
    this.found.textContent = `${this.at + 1} of ${this.matches.length}`;
    this.select(k);
    this.centerOn(this.boxes.get("i" + k));
  }

  // -- details -------------------------------------------------------------
  select(k) {
    if (this.selected !== null && this.boxes.get("i" + this.selected)) {
      this.boxes.get("i" + this.selected).classList.remove("selected");
    }
    this.selected = k;
    const node = this.boxes.get("i" + k);
    if (node) node.classList.add("selected");
    this.showDetails(k);
  }

  showDetails(k) {
    const d = this.details;
    d.replaceChildren();
    if (k === null) {
      html("div", "xg-hint", d, "Click a node for its op, shapes, source lines and HLO. " +
           "Click a grey box to open its group, a group's title to close it. Drag to pan, scroll to zoom.");
      return;
    }
    const item = this.model.items[k];
    html("div", "xg-title", d, item.title);
    const rows = [["op", item.op], ["shapes", (item.avals || []).join(", ")], ["module", item.module],
                  ["user line", item.user], ["library line", item.library], ["arguments", item.args]];
    const marks = MARKS.filter((m) => item[m]).map((m) => (m === "split" ? "the graph is split here" : m));
    if (marks.length) rows.push(["marks", marks.join(", ")]);
    const table = html("table", "xg-table", d);
    for (const [name, value] of rows) {
      if (!value) continue;
      const tr = html("tr", null, table);
      html("th", null, tr, name);
      html("td", null, tr, value);
    }
    if (item.kind === "node" && this.model.hasHlo) {
      html("div", "xg-subtitle", d, item.hlo && item.hlo.length ? "HLO instructions it became"
        : "HLO: none of its own (folded into others, or a no-op)");
      const pre = html("pre", "xg-hlo", d);
      pre.textContent = (item.hlo || []).join("\n");
    }
  }
}

// Draws the model's `graph` in `el`: the graph widget's whole view, and the step view's Graph tab.
export function renderGraph({ model, el }) {
  const view = new GraphView(el, model.get("graph"));
  const update = () => view.setData(model.get("graph"));
  model.on("change:graph", update);
  return () => { model.off("change:graph", update); view.resize.disconnect(); };
}
