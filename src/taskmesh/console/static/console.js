// The console's one script (no inline script anywhere: the CSP forbids it).
// 1. Sections marked data-live="<url>" refresh themselves every few seconds from that page
//    (data-live-seconds="0.5" asks for sooner: a running operation), only while the tab is visible;
//    the rest of the page (forms being typed into) stays.
// 2. <details data-fetch="<url>"> loads its content the first time it is opened (payloads).
"use strict";

const LIVE_SECONDS = 5;

function liveDelay() {
  // The soonest a followed section asks for, else LIVE_SECONDS.
  let seconds = LIVE_SECONDS;
  for (const section of document.querySelectorAll("[data-live]")) {
    const wanted = Number(section.getAttribute("data-live-seconds"));
    if (wanted > 0) seconds = Math.min(seconds, wanted);
  }
  return seconds * 1000;
}

async function followLive() {
  try {
    await refreshLive();
  } catch (err) {
    // offline, rate-limited or restarting: the next tick tries again
  }
  if (document.querySelector("[data-live]")) window.setTimeout(followLive, liveDelay());
}

async function fetchDocument(url) {
  const answer = await fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } });
  if (answer.redirected && new URL(answer.url).pathname.startsWith("/console/sign-in")) {
    window.location.assign(answer.url); // the session ended: sign in again
    return null;
  }
  if (answer.status === 429 || answer.status >= 500) {
    throw new Error(`HTTP ${answer.status}`); // rate-limited or unavailable: keep what is shown, try again later
  }
  const text = await answer.text();
  return new DOMParser().parseFromString(text, "text/html");
}

async function refreshLive() {
  if (document.hidden) return;
  // One fetch per page a section follows; its sections are matched in order.
  const byUrl = new Map();
  for (const section of document.querySelectorAll("[data-live]")) {
    const url = section.getAttribute("data-live");
    if (!byUrl.has(url)) byUrl.set(url, []);
    byUrl.get(url).push(section);
  }
  for (const [url, sections] of byUrl) {
    let fresh;
    try {
      fresh = await fetchDocument(url);
    } catch (err) {
      continue; // offline or the instance restarting: try again at the next tick
    }
    if (fresh === null) return;
    const freshSections = Array.from(fresh.querySelectorAll("[data-live]")).filter(
      (el) => el.getAttribute("data-live") === url,
    );
    sections.forEach((section, i) => {
      if (section.contains(document.activeElement)) return; // never replace a form someone is typing in
      const same = freshSections[i];
      if (same) {
        section.replaceChildren(...Array.from(same.childNodes).map((n) => document.importNode(n, true)));
        return;
      }
      // the page no longer follows it (an operation ended): show its final state once
      const final = section.id ? fresh.getElementById(section.id) : null;
      if (final) section.replaceWith(document.importNode(final, true));
      else section.removeAttribute("data-live");
    });
  }
  const status = document.getElementById("op-status");
  if (status && !document.querySelector("[data-live]")) {
    const fresh = await fetchDocument(window.location.href);
    const final = fresh && fresh.getElementById("op-status");
    if (final) status.replaceWith(document.importNode(final, true));
  }
}

function lazyDetails() {
  for (const details of document.querySelectorAll("details[data-fetch]")) {
    details.addEventListener("toggle", async () => {
      if (!details.open || details.dataset.loaded) return;
      details.dataset.loaded = "1";
      const slot = details.querySelector(".data-slot");
      slot.textContent = "Loading…";
      try {
        const fresh = await fetchDocument(details.getAttribute("data-fetch"));
        if (fresh === null) return;
        slot.replaceChildren(...Array.from(fresh.body.childNodes).map((n) => document.importNode(n, true)));
      } catch (err) {
        slot.textContent = "Could not load it; reopen to try again.";
        delete details.dataset.loaded;
      }
    });
  }
}

function confirmForms() {
  // A select-all box for the dead-letter table.
  const all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", () => {
      for (const box of document.querySelectorAll("input[name=ids]")) box.checked = all.checked;
    });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  lazyDetails();
  confirmForms();
  if (document.querySelector("[data-live]")) {
    window.setTimeout(followLive, liveDelay());
    document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshLive(); });
  }
});
