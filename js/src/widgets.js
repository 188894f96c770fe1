// The bundle's entry: anywidget draws a model with its module's one default export, so the
// two widgets share it: a step view's model has sections, the graph widget's a graph only.
import { renderGraph } from "./graph.js";
import { renderStepView } from "./step_view.js";

function render(props) {
  return (props.model.get("sections") ? renderStepView : renderGraph)(props);
}

export default { render };
