// Builds src/ into ../xlakit/notebook/static/graph.js (or the path given), one ES module for both
// widgets (the step view and the graph) with its libraries (dagre, d3-zoom) inside: notebooks have
// no internet to fetch them.
// The banner's digest covers src/, this file and the package files, so a test can tell,
// without node, that the committed bundle was built from the committed sources
// (tests/test_graph_view.py recomputes it, and rebuilds where node is installed).
import { createHash } from "node:crypto";
import { readFileSync, readdirSync } from "node:fs";
import { build, transform } from "esbuild";

function sourcesDigest() {
  const hash = createHash("sha256");
  const files = ["build.mjs", "package.json", "package-lock.json", ...readdirSync("src").sort().map((f) => `src/${f}`)];
  for (const file of files) {
    hash.update(file + "\0");
    hash.update(readFileSync(file));
    hash.update("\0");
  }
  return hash.digest("hex");
}

// The stylesheet goes in as one string, minified as the rest of the bundle (not a copy of src/graph.css).
const minifiedCss = {
  name: "minified-css",
  setup(b) {
    b.onLoad({ filter: /\.css$/ }, async (args) => ({
      contents: (await transform(readFileSync(args.path, "utf8"), { loader: "css", minify: true })).code,
      loader: "text",
    }));
  },
};

await build({
  entryPoints: ["src/widgets.js"],
  outfile: process.argv[2] ?? "../xlakit/notebook/static/graph.js",
  bundle: true,
  format: "esm",
  minify: true,
  legalComments: "eof",
  plugins: [minifiedCss],
  banner: { js: `// xlakit widgets: built by js/build.mjs from js/src; sources digest ${sourcesDigest()}` },
});
