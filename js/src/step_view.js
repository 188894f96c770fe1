// The step view: the header, a tab bar and one panel per section of the record, as
// xlakit/notebook/step_widget.py sends them. A section's HTML is drawn at once; the Graph
// section (no HTML) draws the interactive graph when its tab is first shown.
import { renderGraph } from "./graph.js";

import CSS from "./step_view.css";

function html(tag, className, parent) {
  const node = document.createElement(tag);
  node.className = className;
  parent.appendChild(node);
  return node;
}

// A record does not change once its view is made: drawn once, nothing to listen to.
export function renderStepView({ model, el }) {
  el.classList.add("xlakit-step-view");
  html("style", "", el).textContent = CSS;
  html("div", "xsv-header", el).innerHTML = model.get("header");
  const bar = html("div", "xsv-tabs", el);
  bar.setAttribute("role", "tablist");
  // ids for aria-controls and aria-labelledby, unique among the page's step views
  const prefix = "xsv-" + Math.random().toString(36).slice(2);
  const sections = model.get("sections");
  const tabs = sections.map(([title, body], i) => {
    const tab = html("button", "xsv-tab", bar);
    const panel = html("div", body === null ? "xsv-panel" : "xsv-panel xlakit-step", el);
    tab.textContent = title;
    tab.type = "button";
    tab.id = `${prefix}-tab${i}`;
    tab.setAttribute("role", "tab");
    tab.setAttribute("aria-controls", `${prefix}-panel${i}`);
    // Lumino's shortcuts pass over a tab: Notebook 7 takes the arrow keys before the page sees them
    tab.dataset.lmSuppressShortcuts = "true";
    tab.addEventListener("click", () => select(i));
    panel.id = `${prefix}-panel${i}`;
    panel.setAttribute("role", "tabpanel");
    panel.setAttribute("aria-labelledby", tab.id);
    if (body !== null) panel.innerHTML = body;
    return { tab, panel };
  });
  let removeGraph = () => {};

  function select(index) {
    tabs.forEach(({ tab, panel }, i) => {
      const shown = i === index;
      tab.setAttribute("aria-selected", String(shown));
      tab.tabIndex = shown ? 0 : -1;
      panel.hidden = !shown;
      if (shown && sections[i][1] === null && !panel.firstChild) {
        removeGraph = renderGraph({ model, el: html("div", "", panel) });
      }
    });
  }

  // the arrow keys, Home and End move between the tabs (WAI-ARIA's tabs, selection following focus)
  bar.addEventListener("keydown", (e) => {
    const at = tabs.findIndex(({ tab }) => tab === e.target);
    const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: tabs.length - 1 }[e.key];
    if (at < 0 || to === undefined) return;
    e.preventDefault();
    const index = (to + tabs.length) % tabs.length;
    select(index);
    tabs[index].tab.focus();
  });
  select(0);
  whenAttached(el, () => unscrollOutputs(el));
  return () => removeGraph();
}

// Notebook 7 scrolls a cell's outputs in a box of ~300 px when they are taller than its
// scroll-output plugin's 1.3 x 14 px x 100 lines, measured at each output change: the view's
// static copy, shown until this view is drawn, made every step view scroll in that box. With the
// copy hidden, the same rule is applied to what the cell now shows.
const NOTEBOOK7_SCROLL_HEIGHT = 1.3 * 14 * 100;

function unscrollOutputs(el) {
  const cell = el.closest(".jp-mod-outputsScrolled");
  const outputs = cell?.querySelector(".jp-OutputArea");
  if (outputs && outputs.scrollHeight <= NOTEBOOK7_SCROLL_HEIGHT) cell.classList.remove("jp-mod-outputsScrolled");
}

// a view is rendered before the frontend puts it in the page
function whenAttached(el, then, frames = 120) {
  if (el.isConnected) then();
  else if (frames > 0) requestAnimationFrame(() => whenAttached(el, then, frames - 1));
}
