// Filled in below the shell.
import { h, replace } from "../lib/dom.js";

export async function render(root) {
  replace(root, h("p", {}, "Coming up."));
}
