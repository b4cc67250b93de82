// A reply as the page shows it: Markdown (marked) sanitized (DOMPurify), code highlighted (highlight.js) with a
// copy button, and every token of the reply wrapped in a span that knows its draft position and round, inside the
// rendered text, code included. Tinting those spans is the stylesheet's job (the overlay), so turning the overlay
// on or off never changes the text.
"use strict";

const Render = (() => {
  const PROBE = 8;   // characters of rendered text looked up in the source to find where rendering resumes
  const REACH = 400; // how far ahead in the source a probe may match (link targets, table rules, fences)
  const NEAR = 12;   // how far ahead a lone character may match

  marked.setOptions({ gfm: true, breaks: false });
  hljs.configure({ ignoreUnescapedHTML: true });

  function title(pos, round) {
    return pos ? `accepted draft token · draft position ${pos} · round ${round}` : `target's own token · round ${round}`;
  }

  // marks: [[length, pos, round], ...], one per token, their lengths summing to text.length.
  function owners(text, marks) {
    const owner = new Int32Array(text.length).fill(-1);
    let at = 0;
    marks.forEach((m, t) => { owner.fill(t, at, Math.min(at + m[0], text.length)); at += m[0]; });
    return owner;
  }

  // Wrap each run of rendered characters that comes from one token in a span. Rendered text is the source with
  // Markdown's markup taken out (and whitespace reflowed), so it is walked in step with the source, jumping ahead
  // past markup by matching the next few rendered characters.
  function markTokens(root, text, marks) {
    if (!marks || !marks.length) return;
    const owner = owners(text, marks);
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (n) => (n.parentElement.closest(".codebar") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT),
    });
    const nodes = [];
    while (walker.nextNode()) nodes.push(walker.currentNode);
    let src = 0;
    for (const node of nodes) {
      const s = node.data, own = new Int32Array(s.length).fill(-1);
      for (let i = 0; i < s.length; i++) {
        const c = s[i];
        if (src < text.length && text[src] === c) { own[i] = owner[src++]; continue; }
        if (/\s/.test(c)) continue;  // whitespace the renderer added or reflowed
        const probe = s.slice(i, i + PROBE);
        let j = probe.length > 1 ? text.indexOf(probe, src) : -1;
        if (j < 0 || j - src > REACH) {
          j = text.indexOf(c, src);
          if (j - src > NEAR) j = -1;
        }
        if (j >= 0) { own[i] = owner[j]; src = j + 1; }
      }
      const frag = document.createDocumentFragment();
      for (let i = 0; i < s.length;) {
        let j = i + 1;
        while (j < s.length && own[j] === own[i]) j++;
        const piece = s.slice(i, j);
        if (own[i] < 0) frag.appendChild(document.createTextNode(piece));
        else {
          const [, pos, round] = marks[own[i]], span = document.createElement("span");
          span.className = pos ? "tok d" : "tok t";
          span.dataset.pos = pos; span.dataset.round = round; span.dataset.token = own[i];
          span.title = title(pos, round);
          span.textContent = piece;
          frag.appendChild(span);
        }
        i = j;
      }
      node.replaceWith(frag);
    }
  }

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    const area = document.createElement("textarea");  // plain http on another host: the old way
    area.value = text; area.style.position = "fixed"; area.style.opacity = "0";
    document.body.appendChild(area); area.select();
    try { document.execCommand("copy"); } finally { area.remove(); }
    return Promise.resolve();
  }

  function decorateCode(root) {
    for (const code of root.querySelectorAll("pre > code")) {
      hljs.highlightElement(code);
      const lang = [...code.classList].find((c) => c.startsWith("language-"));
      const bar = document.createElement("div");
      bar.className = "codebar";
      bar.innerHTML = `<span class="lang"></span><button type="button" class="copy">Copy</button>`;
      bar.querySelector(".lang").textContent = lang ? lang.slice(9) : "";
      const pre = code.parentElement;
      pre.classList.add("code");
      pre.prepend(bar);
    }
  }

  // Render `text` into `el` (replacing what was there); marks as in markTokens, or none for a user's message.
  function render(el, text, marks) {
    el.innerHTML = DOMPurify.sanitize(marked.parse(text));
    decorateCode(el);
    markTokens(el, text, marks);
  }

  // The copy buttons of every rendered reply, by delegation (rendering replaces the buttons as text streams in).
  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("button.copy");
    if (!button) return;
    const code = button.closest("pre").querySelector("code");
    copyText(code.textContent).then(() => {
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    }, () => { button.textContent = "Copy failed"; });
  });

  return { render };
})();
