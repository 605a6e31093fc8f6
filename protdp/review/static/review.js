// protdp review: keyboard shortcuts (approve needs "a" twice, never from the 3D viewer), lease
// countdown and renewal, comment drafts (cleared at logout), selection.
// Same-origin script (CSP script-src 'self'); the pages work without it.
"use strict";

(function () {
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const typing = (el) => el && (el.tagName === "TEXTAREA" || el.tagName === "INPUT" ||
                                el.tagName === "SELECT" || el.isContentEditable);

  // -- comment drafts: kept per item across errors, expired leases and reloads ----------------
  function draftKey(id) { return "protdp-draft-" + id; }
  function setupDrafts() {
    const form = $("#decide-form");
    const box = $("#comment");
    if (!form || !box) return;
    const key = draftKey(form.dataset.itemId);
    if (!box.value && localStorage.getItem(key)) box.value = localStorage.getItem(key);
    box.addEventListener("input", () => localStorage.setItem(key, box.value));
    form.addEventListener("submit", (ev) => {
      const action = ev.submitter ? ev.submitter.value : "approve";
      if (action !== "approve" && !box.value.trim()) {
        ev.preventDefault();
        $("#decide-hint").textContent = "A comment is required to " + action + ".";
        box.focus();
      }
    });
  }
  function clearDecidedDraft() {
    const m = /[?&]decided=(\d+)/.exec(location.search);
    if (m) localStorage.removeItem(draftKey(m[1]));
  }

  // -- lease countdown and renewal (remaining time comes from the server's clock) --------------
  function fmt(s) {
    s = Math.max(0, Math.floor(s));
    return Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0");
  }
  function setupLease() {
    const el = $("#lease");
    if (!el) return;
    let deadline = performance.now() + 1000 * parseFloat(el.dataset.remaining);
    const mine = el.dataset.mine === "1";
    const tick = () => {
      const left = (deadline - performance.now()) / 1000;
      el.textContent = left > 0 ? (mine ? "your lease: " : "lease: ") + fmt(left) + " left"
                                : "lease over: anyone may claim this item (your draft is kept)";
      el.classList.toggle("warn", left < 60);
    };
    tick();
    setInterval(tick, 1000);
    const form = $("#renew-form");
    if (!form) return;
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const resp = await fetch(form.action, {method: "POST", body: new FormData(form),
                                             headers: {"Accept": "application/json"}});
      const data = await resp.json().catch(() => ({}));
      if (resp.ok && data.lease_remaining_s) {
        deadline = performance.now() + 1000 * data.lease_remaining_s;
        tick();
      } else {
        el.textContent = data.error || "renewal failed";
      }
    });
  }

  // -- queue: selection, row cursor -------------------------------------------------------------
  function rows() { return $$("#queue tbody tr[data-href]"); }
  let cursor = -1;
  function moveCursor(delta) {
    const all = rows();
    if (!all.length) return;
    cursor = Math.min(all.length - 1, Math.max(0, cursor + delta));
    all.forEach((r, i) => r.classList.toggle("cursor", i === cursor));
    all[cursor].scrollIntoView({block: "nearest"});
  }
  function setupSelection() {
    const all = $("#select-all");
    const count = () => {
      const n = $$("input.pick:checked").length;
      const el = $("#selected-count");
      if (el) el.textContent = n ? n + " selected" : "";
    };
    if (all) all.addEventListener("change", () => {
      $$("input.pick").forEach((c) => { c.checked = all.checked; });
      count();
    });
    $$("input.pick").forEach((c) => c.addEventListener("change", count));
  }

  function click(sel) { const el = $(sel); if (el) { el.click(); return true; } return false; }

  // -- drafts never outlive the session (the server also sends Clear-Site-Data at logout) -------
  function setupLogout() {
    const btn = $("#logout");
    if (!btn || !btn.form) return;
    btn.form.addEventListener("submit", () => {
      Object.keys(localStorage).filter((k) => k.startsWith("protdp-draft-"))
        .forEach((k) => localStorage.removeItem(k));
    });
  }

  // -- approve by keyboard: "a" arms, a second "a" within ARM_MS approves; never while the
  // pointer last acted inside the 3D viewer (a click there gives it the keyboard's attention)
  const ARM_MS = 3000;
  let armedAt = -Infinity;
  let inViewer = false;
  function setupViewerGuard() {
    document.addEventListener("pointerdown", (ev) => {
      const viewer = $("#viewer");
      inViewer = !!(viewer && viewer.contains(ev.target));
      armedAt = -Infinity;
    }, true);
  }
  function approveKey() {
    const hint = $("#decide-hint");
    if (inViewer) {
      if (hint) hint.textContent = "Keys are off while you work in the 3D view; click outside it first.";
      return true;
    }
    if (!$("#approve")) return false;
    if (performance.now() - armedAt < ARM_MS) {
      armedAt = -Infinity;
      return click("#approve");
    }
    armedAt = performance.now();
    if (hint) hint.textContent = "Press a again to approve.";
    return true;
  }

  // -- keyboard shortcuts -----------------------------------------------------------------------
  function onKey(ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || typing(document.activeElement)) return;
    const viewer = $("#viewer");
    if (viewer && viewer.contains(document.activeElement)) return;   // the viewer's own keys
    if (ev.key !== "a") armedAt = -Infinity;
    const head = $("#item-head");
    const key = ev.key;
    let done = true;
    if (head) {                                     // item page
      if (key === "j" && head.dataset.next) location.href = head.dataset.next;
      else if (key === "k" && head.dataset.prev) location.href = head.dataset.prev;
      else if (key === "a") done = approveKey();
      else if (inViewer && (key === "r" || key === "e")) done = true;   // not from the viewer
      else if (key === "r") done = click("#reject");
      else if (key === "e") done = click("#escalate");
      else if (key === "c") done = click("#claim") || click("#renew");
      else if (key === "n") done = click("#claim-next");
      else done = false;
    } else if ($("#queue")) {                       // queue page
      const all = rows();
      if (key === "j") moveCursor(1);
      else if (key === "k") moveCursor(-1);
      else if ((key === "o" || key === "Enter") && all[cursor]) location.href = all[cursor].dataset.href;
      else if (key === "x" && all[cursor]) { const c = $("input.pick", all[cursor]); c.click(); }
      else if (key === "n") done = click("#claim-next");
      else done = false;
    } else done = false;
    if (done) ev.preventDefault();
  }

  document.addEventListener("DOMContentLoaded", () => {
    setupDrafts();
    clearDecidedDraft();
    setupLease();
    setupSelection();
    setupLogout();
    setupViewerGuard();
    document.addEventListener("keydown", onKey);
    document.body.dataset.shortcuts = "ready";
  });
})();
