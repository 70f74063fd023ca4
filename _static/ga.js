// The G&A companion. On a phone, the first page's summary table folds each chapter's claims
// (a tap unfolds them): unfolded, that table is many screens long. Elsewhere they stay open.
document.addEventListener("DOMContentLoaded", () => {
  if (window.matchMedia("(max-width: 600px)").matches) {
    document.querySelectorAll("details.ga-claims").forEach((d) => d.removeAttribute("open"));
  }
});
