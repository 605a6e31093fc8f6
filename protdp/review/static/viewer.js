// protdp review: the 3D view of a predicted structure (vendored 3Dmol.js, no CDN).
// Loads whatever PDB/mmCIF the item's folder holds (backbone-only or all-atom), cartoon plus
// side-chain sticks, every atom coloured by its B-factor (= pLDDT) in the AFDB bands.
// Clicking a residue of the sequence centres the view on it. A complex (data-chains) starts
// coloured by chain (the server's palette) and #colour-toggle switches to pLDDT and back.
"use strict";

(function () {
  // [[floor, inclusive, colour], ...] highest band first, from protdp.gating (one definition)
  const el0 = document.getElementById("viewer");
  const BANDS = el0 ? JSON.parse(el0.dataset.bands) : [];
  const inBand = (b, [lo, inclusive]) => (inclusive ? b >= lo : b > lo);
  const bandColour = (atom) => (BANDS.find((band) => inBand(atom.b, band)) || BANDS[BANDS.length - 1])[2];
  const CHAINS = el0 && el0.dataset.chains ? JSON.parse(el0.dataset.chains) : [];
  const CHAIN_COLOUR = new Map(CHAINS.map((c) => [c.chain_id, c.color]));
  const chainColour = (atom) => CHAIN_COLOUR.get(atom.chain) || "#808080";
  const colour = (atom) => (el0.dataset.colouring === "chain" ? chainColour : bandColour)(atom);
  const BACKBONE = new Set(["N", "CA", "C", "O", "OXT"]);

  async function load() {
    const el = document.getElementById("viewer");
    const status = document.getElementById("viewer-status");
    if (!el) return;
    try {
      if (typeof $3Dmol === "undefined") throw new Error("3Dmol.js did not load");
      const resp = await fetch(el.dataset.src, {credentials: "same-origin"});
      if (!resp.ok) throw new Error("structure file: HTTP " + resp.status);
      const text = await resp.text();
      const viewer = $3Dmol.createViewer(el, {backgroundColor: "white", antialias: true});
      const model = viewer.addModel(text, el.dataset.format === "cif" ? "cif" : "pdb");
      const atoms = model.selectedAtoms({});
      if (!atoms.length) throw new Error("no atoms in the structure file");
      const side = atoms.filter((a) => !BACKBONE.has(a.atom) && a.elem !== "H");
      const base = () => {
        // cartoon for the fold, sticks for every atom so side chains (all-atom models) and
        // broken or unusual backbones stay visible; CA-only traces get spheres
        viewer.setStyle({}, {cartoon: {colorfunc: colour, thickness: 0.4},
                             stick: {colorfunc: colour, radius: 0.12}});
        if (atoms.every((a) => a.atom === "CA")) {
          viewer.addStyle({}, {sphere: {colorfunc: colour, scale: 0.3}});
        }
      };
      base();
      viewer.setHoverable({}, true, (atom) => {
        status.textContent = (CHAINS.length ? "chain " + atom.chain + " " : "") + atom.resn + atom.resi +
          " " + atom.atom + "  pLDDT " + atom.b.toFixed(1);
      }, () => {});
      viewer.zoomTo();
      viewer.render();
      el.dataset.atoms = String(atoms.length);
      el.dataset.residues = String(new Set(atoms.map((a) => a.chain + ":" + a.resi)).size);
      el.dataset.sidechainAtoms = String(side.length);
      el.dataset.bfactors = atoms.filter((a) => a.atom === "CA").map((a) => a.b).join(",");
      el.dataset.chainIds = [...new Set(atoms.map((a) => a.chain))].join(",");
      el.dataset.chainColours = [...new Set(atoms.map((a) => a.chain))].map(
        (c) => chainColour({chain: c})).join(",");
      const toggle = document.getElementById("colour-toggle");
      if (toggle) {
        toggle.addEventListener("click", () => {
          const toChain = el.dataset.colouring !== "chain";
          el.dataset.colouring = toChain ? "chain" : "plddt";
          toggle.textContent = toChain ? "Colour by pLDDT" : "Colour by chain";
          document.getElementById("colour-by").textContent = "coloured by " + (toChain ? "chain" : "pLDDT");
          document.getElementById("band-legend").hidden = toChain;
          base();
          viewer.render();
        });
      }
      el.dataset.state = "loaded";
      status.textContent = atoms.length + " atoms; drag to rotate, scroll to zoom; " +
                           "hover an atom for its pLDDT";
      document.querySelectorAll("#sequence .res").forEach((span) => {
        span.addEventListener("click", () => {
          // a complex's residue is (chain, number within the chain): every chain starts at 1
          const sel = {resi: parseInt(span.dataset.resi, 10)};
          if (span.dataset.chain) sel.chain = span.dataset.chain;
          base();
          viewer.addStyle(sel, {stick: {colorscheme: "magentaCarbon", radius: 0.3}});
          viewer.zoomTo(sel, 400);
          viewer.render();
          document.querySelectorAll("#sequence .res.picked").forEach((s) => s.classList.remove("picked"));
          span.classList.add("picked");
        });
      });
    } catch (err) {
      el.dataset.state = "error";
      el.dataset.error = String(err && err.message || err);
      if (status) status.textContent = "3D view unavailable: " + el.dataset.error;
    }
  }
  document.addEventListener("DOMContentLoaded", load);
})();
