// Engram memory browser. A client of this gateway's public HTTP API (docs/api.md) and
// nothing else: every read and write below is one documented API call, sent with the
// API key the user signed in with (kept in this tab's sessionStorage only). The DOM is
// built with text nodes only (no HTML parsing), so memory text can never become markup.
"use strict";

const KEY_STORAGE = "engram.apiKey";
const EVENTS_STORAGE = "engram.events";
const SCORE_NAMES = ["dense", "sparse", "relevance", "recency", "total", "mmr"];
const VIEWS = ["signin", "memories", "memory", "search", "add", "profile", "events", "operator"];
const EVENT_POLL_MS = 3000;

const $ = (id) => document.getElementById(id);

// --- small helpers ---------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function when(iso) {
  return iso ? `${iso.slice(0, 10)} ${iso.slice(11, 16)} UTC` : "—";
}

function score(value) {
  return value === null || value === undefined ? "—" : Number(value).toFixed(3);
}

function clip(text, max = 280) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function tagsFrom(input) {
  return input.split(",").map((t) => t.trim()).filter(Boolean);
}

// A status message belongs to the view it is about ("Deleted…" to the list the delete
// returns to); showing any other view clears it. ANY_VIEW: the next view shown, whichever.
const ANY_VIEW = "*";
let shownView = null;
let statusView = null;

function say(message, bad = false, view = shownView) {
  const status = $("status");
  status.textContent = message;
  status.classList.toggle("bad", bad);
  statusView = view;
}

function memoryLink(memory) {
  return h("a", { class: "text", href: `#/memory/${memory.id}` }, clip(memory.text || "(no text)"));
}

function kindBadge(kind) {
  return h("span", { class: `badge ${kind}` }, kind);
}

function scopeOf(memory) {
  const user = memory.user_id ? `user ${memory.user_id}` : "no user";
  return `${user} · ${memory.conversation_id}`;
}

function fillTable(table, rows) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
  if (!rows.length) {
    const columns = table.tHead.rows[0].cells.length;
    body.append(h("tr", {}, h("td", { colspan: columns, class: "hint" }, "Nothing here.")));
  }
}

// --- the API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const auth = {
  needsKey: true,
  get key() {
    return sessionStorage.getItem(KEY_STORAGE) || "";
  },
  set key(value) {
    if (value) sessionStorage.setItem(KEY_STORAGE, value);
    else sessionStorage.removeItem(KEY_STORAGE);
  },
};

async function api(method, path, { params = {}, body, key = auth.key } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(params)) {
    for (const one of Array.isArray(value) ? value : [value]) {
      if (one !== null && one !== undefined) url.searchParams.append(name, one);
    }
  }
  const headers = { Accept: "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, "network", `The gateway cannot be reached (${error.message}).`);
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = data && data.error ? data.error : {};
    throw new ApiError(response.status, detail.code || "", detail.message || response.statusText);
  }
  return data;
}

// Every failed call ends here: a refused key sends the user back to sign in.
function failed(error) {
  if (error instanceof ApiError && error.status === 401 && auth.needsKey) {
    auth.key = "";
    showSignIn("The API key was refused; sign in again.");
    return;
  }
  say(error.message, true);
}

// --- signing in and routing -------------------------------------------------------------

async function probe(key) {
  await api("GET", "/v1/users", { params: { limit: 1 }, key });
}

async function start() {
  wire();
  try {
    await probe("");
    auth.needsKey = false;
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 401) {
      say(error.message, true, ANY_VIEW);
    }
  }
  if (auth.needsKey && auth.key) {
    try {
      await probe(auth.key);
    } catch (error) {
      auth.key = "";
    }
  }
  window.addEventListener("hashchange", route);
  route();
}

function signedIn() {
  return !auth.needsKey || Boolean(auth.key);
}

function showSignIn(message = "") {
  $("signin-error").textContent = message;
  if (window.location.hash !== "#/signin") window.location.hash = "#/signin";
  else route();
}

async function signIn(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  try {
    await probe(key);
  } catch (error) {
    $("signin-error").textContent =
      error.status === 401 ? "That key is not valid for this gateway." : error.message;
    return;
  }
  auth.key = key;
  $("api-key").value = "";
  say("Signed in.", false, "memories");
  window.location.hash = "#/memories";
}

function signOut() {
  auth.key = "";
  say("Signed out.", false, "signin");
  showSignIn();
}

function showView(name) {
  if (statusView === ANY_VIEW) statusView = name;
  else if (statusView !== name) say("", false, null);
  shownView = name;
  for (const view of VIEWS) $(`view-${view}`).hidden = view !== name;
  const tab = name === "memory" ? "memories" : name;
  for (const link of $("tabs").querySelectorAll("a")) {
    if (link.getAttribute("href") === `#/${tab}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const inside = name !== "signin";
  $("tabs").hidden = !inside;
  $("sign-out").hidden = !inside || !auth.needsKey;
  $("who").hidden = !inside;
  $("who").textContent = auth.needsKey ? "Signed in with an API key" : "Single-tenant: no key needed";
  const title = $(`view-${name}`).querySelector("h2");
  if (title) title.focus();
}

const LOADERS = {
  memories: () => Promise.all([loadUsers(), loadMemories()]),
  search: async () => {},
  add: async () => {},
  profile: async () => ($("p-user").value ? loadProfile() : undefined),
  events: () => loadEvents(),
  operator: () => loadOperator(),
};

function route() {
  stopEventPolling();
  const [, view = "memories", id] = window.location.hash.split("/");
  if (!signedIn()) {
    showView("signin");
    return;
  }
  if (view === "signin") {
    window.location.hash = "#/memories";
    return;
  }
  if (view === "memory" && id) {
    showView("memory");
    loadMemory(decodeURIComponent(id)).catch(failed);
    return;
  }
  const name = LOADERS[view] ? view : "memories";
  showView(name);
  LOADERS[name]().catch(failed);
}

// --- browsing -------------------------------------------------------------------------------

const browse = { cursors: [""], page: 0, user: null };

function filterParams() {
  const form = $("filter-form");
  const data = new FormData(form);
  const given = (name) => data.get(name).trim() || undefined;
  const params = {
    // "" (memories without a user) only when picked in the list; an empty field: any user
    user: browse.user === "" ? "" : given("user"),
    conversation: given("conversation"),
    tag: given("tag"),
    kind: data.getAll("kind"),
    limit: data.get("limit"),
    include_superseded: data.get("superseded") ? "true" : undefined,
  };
  if (data.get("from")) params.created_after = `${data.get("from")}T00:00:00Z`;
  if (data.get("until")) {
    const next = new Date(`${data.get("until")}T00:00:00Z`);
    next.setUTCDate(next.getUTCDate() + 1); // "until" includes that whole day
    params.created_before = next.toISOString();
  }
  return params;
}

// A user's display name (what their chat client forwarded; a label, not identity)
// beside the id, or the id alone.
function userLabel(user) {
  if (!user.id) return "(no user)";
  if (!user.name) return user.id;
  return h("span", { class: "user-name" }, user.name, " ", h("small", { class: "user-id" }, user.id));
}

// The user picked in the list: null (every user), "" (memories without a user) or an id.
async function loadUsers() {
  const users = await api("GET", "/v1/users", { params: { limit: 200 } });
  $("user-list").replaceChildren(
    ...users.data.map((user) =>
      scopeButton(userLabel(user), user.memories, user.id === browse.user, () => chooseUser(user.id)),
    ),
  );
  if (!users.data.length) $("user-list").append(h("li", { class: "hint" }, "No memories yet."));
  await loadConversations();
}

async function loadConversations() {
  const list = $("conversation-list");
  if (browse.user === null) {
    list.replaceChildren(h("li", { class: "hint" }, "Choose a user to see their conversations."));
    return;
  }
  const found = await api("GET", "/v1/conversations", { params: { user: browse.user, limit: 200 } });
  const chosen = $("f-conversation").value.trim();
  list.replaceChildren(
    ...found.data.map((c) =>
      scopeButton(c.id, c.memories, c.id === chosen, () => chooseConversation(c.id)),
    ),
  );
}

// A long id (Open WebUI's "temporary:h6s42zjeEPi0-SrvAAAL") is cut with an ellipsis,
// whole in its tooltip, so the count beside it always stays in view.
function scopeButton(label, count, pressed, choose) {
  const full = typeof label === "string" ? label : label.textContent;
  return h(
    "li",
    {},
    h(
      "button",
      { type: "button", "aria-pressed": String(pressed), onclick: choose, title: full },
      h("span", { class: "label" }, label),
      h("span", { class: "count", "aria-label": `${count} memories` }, count),
    ),
  );
}

function chooseUser(user) {
  browse.user = user;
  $("f-user").value = user || "";
  $("f-conversation").value = "";
  restartPaging();
  loadUsers().catch(failed);
}

function chooseConversation(conversation) {
  $("f-conversation").value = conversation;
  restartPaging();
  loadConversations().catch(failed);
}

function restartPaging() {
  browse.cursors = [""];
  browse.page = 0;
  loadMemories().catch(failed);
}

async function loadMemories() {
  const params = { ...filterParams(), cursor: browse.cursors[browse.page] || undefined };
  const page = await api("GET", "/v1/memories", { params });
  const list = $("memory-list");
  list.replaceChildren(...page.data.map(memoryItem));
  if (!page.data.length) list.append(h("p", { class: "hint" }, "No memories match."));
  if (page.has_more) browse.cursors[browse.page + 1] = page.next_cursor;
  browse.cursors.length = browse.page + (page.has_more ? 2 : 1);
  $("page-older").disabled = !page.has_more;
  $("page-newer").disabled = browse.page === 0;
  $("page-number").textContent = `Page ${browse.page + 1}`;
}

function memoryItem(memory) {
  return h(
    "article",
    { class: "item" },
    memoryLink(memory),
    h(
      "p",
      { class: "meta" },
      kindBadge(memory.kind),
      h("span", {}, scopeOf(memory)),
      h("span", {}, when(memory.created_at)),
      memory.tags.length ? h("span", {}, `tags: ${memory.tags.join(", ")}`) : null,
      memory.superseded_by ? h("span", {}, "superseded") : null,
    ),
  );
}

// --- search ---------------------------------------------------------------------------------

async function search(event) {
  event.preventDefault();
  const body = {
    query: $("s-query").value,
    user: $("s-user").value.trim(),
    conversation: $("s-conversation").value.trim() || "default",
  };
  if ($("s-top-k").value) body.memory_top_k = Number($("s-top-k").value);
  const found = await api("POST", "/v1/memories/search", { body });
  const outcomes = {
    ranked:
      "Ranked by relevance, recency and diversity (MMR), then shown in reading order: a current " +
      "fact before the turns it came from and before turns about as relevant. " +
      "“rank” is a hit's place by score.",
    small_store: "Few memories in scope: all of them, newest first.",
    nothing_relevant: "Nothing passed the relevance threshold.",
    empty: "Nothing is stored in this scope.",
  };
  $("search-outcome").textContent = `${found.hits.length} hit(s). ${outcomes[found.outcome] || found.outcome}`;
  const byScore = [...found.hits].sort((a, b) => b.score - a.score);
  $("search-hits").replaceChildren(...found.hits.map((hit) => hitItem(hit, byScore.indexOf(hit) + 1)));
  const context = [];
  if (found.summary) {
    context.push(h("div", { class: "card" }, h("h3", {}, "Conversation summary"), h("p", {}, found.summary.text)));
  }
  if (found.profile.length) {
    context.push(
      h(
        "div",
        { class: "card" },
        h("h3", {}, "Profile (always recalled)"),
        h("ul", {}, found.profile.map((entry) => h("li", {}, entry.text))),
      ),
    );
  }
  $("search-context").replaceChildren(...context);
}

function hitItem(hit, rank) {
  // data-label: at phone width the row wraps into labelled cells (app.css), none cut off
  const table = h(
    "table",
    { class: "scores", "aria-label": "Score breakdown" },
    h("thead", {}, h("tr", {}, SCORE_NAMES.map((name) => h("th", { scope: "col" }, name)))),
    h(
      "tbody",
      {},
      h("tr", {}, SCORE_NAMES.map((name) => h("td", { class: "num", "data-label": name }, score(hit.scores[name])))),
    ),
  );
  return h(
    "li",
    { class: "item hit" },
    memoryLink(hit),
    h(
      "p",
      { class: "meta" },
      kindBadge(hit.kind),
      h("span", { class: "rank" }, `rank ${rank}`),
      h("span", {}, `scope: ${hit.scope || "—"}`),
      h("span", {}, `score ${score(hit.score)}`),
      h("span", {}, scopeOf(hit)),
      h("span", {}, when(hit.created_at)),
    ),
    h("div", { class: "scroll" }, table),
  );
}

// --- one memory ------------------------------------------------------------------------------

const FIELD_ORDER = [
  "id", "kind", "role", "user_id", "conversation_id", "tags", "created_at", "updated_at",
  "valid_from", "valid_to", "superseded_by", "source_id", "turn_index", "source_turn_ids",
  "turn_range", "profile", "metadata",
];
let current = null;

async function loadMemory(id) {
  // Nothing of the memory shown before stays usable while this one loads.
  current = null;
  $("memory-text").textContent = "Loading…";
  $("memory-fields").replaceChildren();
  $("delete-confirm").hidden = true;
  for (const input of $("edit-form").elements) input.disabled = true;
  $("history-list").replaceChildren();
  $("source-list").replaceChildren();
  current = await api("GET", `/v1/memories/${encodeURIComponent(id)}`);
  $("memory-title").textContent = `Memory · ${current.kind}`;
  $("memory-text").textContent = current.text;
  $("memory-fields").replaceChildren(...FIELD_ORDER.flatMap((name) => field(name, current[name])));
  $("edit-text").value = current.text;
  $("edit-tags").value = current.tags.join(", ");
  $("delete-confirm").hidden = true;
  const superseded = Boolean(current.superseded_by);
  for (const input of $("edit-form").elements) input.disabled = superseded && input.id !== "delete-start";
  $("superseded-note").hidden = !superseded;
  $("superseded-note").replaceChildren(
    "A newer version replaced this one; edit ",
    h("a", { href: `#/memory/${current.superseded_by}` }, "the current version"),
    ".",
  );
  $("history-list").replaceChildren();
  $("history-load").hidden = false;
  await loadSources(current.source_turn_ids);
}

function field(name, value) {
  let shown;
  if (value === null || value === undefined || value === "" || (Array.isArray(value) && !value.length)) {
    shown = "—";
  } else if (name === "superseded_by") {
    shown = h("a", { href: `#/memory/${value}` }, value);
  } else if (Array.isArray(value)) {
    shown = value.join(", ");
  } else if (typeof value === "object") {
    shown = Object.entries(value).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join("\n");
  } else {
    shown = String(value);
  }
  return [h("dt", {}, name), h("dd", {}, shown)];
}

async function loadHistory() {
  const history = await api("GET", `/v1/memories/${current.id}/history`);
  const list = $("history-list");
  // oldest first: each version was replaced by the next one, the last by the memory itself
  const successors = [...history.data.slice(1), current];
  list.replaceChildren(...history.data.map((version, i) => versionItem(version, successors[i])));
  if (!history.data.length) list.append(h("li", { class: "hint" }, "No earlier versions: it was never changed."));
  $("history-load").hidden = true;
  list.focus();
}

// Words of two texts as kept (" x"), removed ("-x") or added ("+x"): a longest common
// subsequence over words, enough for memory texts (at most a few thousand words).
function wordDiff(before, after) {
  const a = before.split(/(\s+)/);
  const b = after.split(/(\s+)/);
  const common = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  const parts = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) {
      parts.push([" ", a[i]]);
      i += 1;
      j += 1;
    } else if (i < a.length && (j === b.length || common[i + 1][j] >= common[i][j + 1])) {
      parts.push(["-", a[i]]); // removed words before the ones that replace them
      i += 1;
    } else {
      parts.push(["+", b[j]]);
      j += 1;
    }
  }
  return parts;
}

// What the change that ended ``version`` did: its text as a word diff, tags added/removed.
function changeOf(version, successor) {
  const changes = [];
  if (successor && successor.text !== version.text) {
    const words = wordDiff(version.text, successor.text).map(([op, word]) =>
      op === "+" ? h("ins", {}, word) : op === "-" ? h("del", {}, word) : word,
    );
    changes.push(h("p", { class: "diff text-diff" }, h("span", { class: "what" }, "text: "), words));
  }
  const before = new Set(version.tags);
  const after = new Set(successor ? successor.tags : version.tags);
  const added = [...after].filter((tag) => !before.has(tag));
  const removed = [...before].filter((tag) => !after.has(tag));
  if (added.length || removed.length) {
    changes.push(
      h(
        "p",
        { class: "diff tag-diff" },
        h("span", { class: "what" }, "tags: "),
        added.map((tag) => [h("ins", {}, `+${tag}`), " "]),
        removed.map((tag) => [h("del", {}, `−${tag}`), " "]),
        h("span", { class: "hint" }, `(were: ${version.tags.join(", ") || "none"})`),
      ),
    );
  }
  if (!changes.length) changes.push(h("p", { class: "diff hint" }, "Neither text nor tags changed."));
  return changes;
}

function versionItem(version, successor) {
  const how = version.metadata.history_of ? "edited" : "superseded by a newer memory";
  const metadata = Object.entries(version.metadata).map(([k, v]) => `${k}=${v}`).join(", ");
  return h(
    "li",
    { class: "item" },
    h("p", { class: "text" }, version.text),
    changeOf(version, successor),
    h(
      "p",
      { class: "meta" },
      h("span", {}, `valid ${when(version.valid_from || version.created_at)} → ${when(version.valid_to)}`),
      h("span", {}, how, " (", h("a", { href: `#/memory/${version.superseded_by}` }, "replacement"), ")"),
      metadata ? h("span", {}, metadata) : null,
    ),
  );
}

async function loadSources(ids) {
  const list = $("source-list");
  list.replaceChildren();
  if (!ids.length) {
    list.append(h("li", { class: "hint" }, "Not derived from stored turns."));
    return;
  }
  for (const id of ids) {
    try {
      const turn = await api("GET", `/v1/memories/${encodeURIComponent(id)}`);
      list.append(
        h("li", { class: "item" }, memoryLink(turn), h("p", { class: "meta" }, turn.role || turn.kind, " · ", when(turn.created_at))),
      );
    } catch (error) {
      if (error.status !== 404) throw error;
      list.append(h("li", { class: "hint" }, `${id} (no longer stored)`));
    }
  }
}

async function saveMemory(event) {
  event.preventDefault();
  const body = { text: $("edit-text").value, tags: tagsFrom($("edit-tags").value) };
  await api("PATCH", `/v1/memories/${current.id}`, { body });
  await loadMemory(current.id);
  say("Saved. The previous version is kept in its history.");
}

async function deleteMemory() {
  const gone = await api("DELETE", `/v1/memories/${current.id}`);
  const count = gone.deleted_ids.length;
  say(`Deleted ${count} memor${count === 1 ? "y" : "ies"} (with its history).`, false, "memories");
  current = null;
  window.location.hash = "#/memories";
}

// --- adding -----------------------------------------------------------------------------------

async function rememberFact(event) {
  event.preventDefault();
  const body = {
    text: $("fact-text").value,
    user: $("fact-user").value.trim(),
    conversation: $("fact-conversation").value.trim() || "default",
    tags: tagsFrom($("fact-tags").value),
  };
  const memory = await api("POST", "/v1/memories", { body });
  $("fact-text").value = "";
  say("Remembered.", false, "memory");
  window.location.hash = `#/memory/${memory.id}`;
}

async function learn(event) {
  event.preventDefault();
  const texts = $("learn-text").value.split("\n").map((t) => t.trim()).filter(Boolean);
  if (!texts.length) return;
  const body = {
    text: texts,
    user: $("learn-user").value.trim(),
    conversation: $("learn-conversation").value.trim() || "default",
  };
  const accepted = await api("POST", "/v1/memories/add", { body });
  const now = new Date().toISOString();
  const known = storedEvents();
  // newest batch first, each batch in the order its texts were given
  known.unshift(...accepted.event_ids.map((id, i) => ({ id, text: clip(texts[i], 80), added: now })));
  sessionStorage.setItem(EVENTS_STORAGE, JSON.stringify(known.slice(0, 100)));
  $("learn-text").value = "";
  say(`Accepted ${accepted.event_ids.length} text(s) for learning.`, false, "events");
  window.location.hash = "#/events";
}

// --- events -----------------------------------------------------------------------------------

let eventTimer = null;

function storedEvents() {
  try {
    return JSON.parse(sessionStorage.getItem(EVENTS_STORAGE) || "[]");
  } catch {
    return [];
  }
}

function stopEventPolling() {
  clearTimeout(eventTimer);
  eventTimer = null;
}

// The reason when nothing was learned; else the fallback a task took (facts kept as said).
function eventStatusText(status) {
  if (status.reason) return `${status.status}: ${status.reason}`;
  if (status.fallback) return `${status.status}, by the fallback: ${status.fallback}`;
  return status.status;
}

async function loadEvents() {
  stopEventPolling();
  const rows = [];
  let pending = false;
  for (const known of storedEvents()) {
    let status;
    try {
      status = await api("GET", `/v1/events/${known.id}`);
    } catch (error) {
      if (error.status !== 404) throw error;
      status = { status: "unknown", stage: null, applied_at: null };
    }
    pending = pending || status.status === "pending";
    rows.push(
      h(
        "tr",
        {},
        h("td", {}, known.text),
        h("td", {}, h("code", {}, known.id.slice(0, 8))),
        h("td", {}, eventStatusText(status)),
        h("td", {}, status.stage || "—"),
        h("td", {}, when(known.added)),
        h("td", {}, when(status.applied_at)),
      ),
    );
  }
  fillTable($("events-table"), rows);
  if (pending && !$("view-events").hidden) {
    eventTimer = setTimeout(() => loadEvents().catch(failed), EVENT_POLL_MS);
  }
}

// --- profile and summaries ------------------------------------------------------------------

async function loadProfile(event) {
  if (event) event.preventDefault();
  const user = $("p-user").value.trim();
  const [profile, summaries] = await Promise.all([
    api("GET", "/v1/memories", { params: { user, kind: "profile", limit: 500 } }),
    api("GET", "/v1/memories", { params: { user, kind: ["summary", "episode"], limit: 100 } }),
  ]);
  fillTable(
    $("profile-table"),
    profile.data.map((memory) => {
      const entry = memory.profile || { category: "", key: "", value: memory.text, confidence: null };
      return h(
        "tr",
        {},
        h("td", {}, entry.category),
        h("td", {}, entry.key),
        h("td", {}, h("a", { href: `#/memory/${memory.id}` }, entry.value)),
        h("td", { class: "num" }, score(entry.confidence)),
        h("td", {}, when(memory.updated_at)),
      );
    }),
  );
  const list = $("summary-list");
  list.replaceChildren(
    ...summaries.data.map((memory) =>
      h(
        "li",
        { class: "item" },
        memoryLink(memory),
        h("p", { class: "meta" }, kindBadge(memory.kind), h("span", {}, memory.conversation_id), h("span", {}, when(memory.updated_at))),
      ),
    ),
  );
  if (!list.children.length) list.append(h("li", { class: "hint" }, "No summaries yet."));
}

// --- operator ----------------------------------------------------------------------------------

async function loadOperator() {
  try {
    const consumers = await api("GET", "/v1/admin/consumers");
    fillTable(
      $("consumers-table"),
      consumers.data.map((c) =>
        h(
          "tr",
          {},
          h("td", {}, c.worker),
          h("td", {}, c.subject),
          ...[c.pending, c.ack_pending, c.redelivered, c.dead_letters].map((n) => h("td", { class: "num" }, n)),
        ),
      ),
    );
    await loadDeadLetters();
  } catch (error) {
    if (error.status === 404) {
      say("This gateway has no operator endpoints.", true);
      return;
    }
    if (error.status === 403) {
      // Queue sizes and dead letters are every tenant's: an operator's (admin) key only.
      fillTable($("consumers-table"), []);
      fillTable($("dead-table"), []);
      say("The operator panel needs an admin key; this key reads and writes its own tenant's memories only.", true);
      return;
    }
    throw error;
  }
}

async function loadDeadLetters(event) {
  if (event) event.preventDefault();
  const params = { worker: $("d-worker").value.trim() || undefined, limit: $("d-limit").value || 50 };
  const letters = await api("GET", "/v1/admin/dead-letters", { params });
  fillTable(
    $("dead-table"),
    letters.data.map((d) =>
      h(
        "tr",
        {},
        h("td", {}, when(d.failed_at)),
        h("td", {}, d.worker),
        h("td", {}, d.subject),
        h("td", {}, d.reason),
        h("td", { class: "num" }, d.deliveries),
        h("td", {}, d.event_id ? h("code", {}, d.event_id.slice(0, 8)) : "—"),
        h("td", {}, d.tenant || "—"),
        h("td", {}, d.conversation_id || "—"),
      ),
    ),
  );
}

// --- wiring -----------------------------------------------------------------------------------

function guarded(handler) {
  return (event) => {
    Promise.resolve(handler(event)).catch(failed);
  };
}

function wire() {
  $("signin-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", signOut);
  $("filter-form").addEventListener("submit", (event) => {
    event.preventDefault();
    browse.user = $("f-user").value.trim() || null;
    restartPaging();
    loadUsers().catch(failed);
  });
  $("filter-form").addEventListener("reset", () => setTimeout(() => chooseUser(null), 0));
  $("page-older").addEventListener("click", guarded(() => {
    browse.page += 1;
    return loadMemories();
  }));
  $("page-newer").addEventListener("click", guarded(() => {
    browse.page = Math.max(0, browse.page - 1);
    return loadMemories();
  }));
  $("search-form").addEventListener("submit", guarded(search));
  $("edit-form").addEventListener("submit", guarded(saveMemory));
  $("delete-start").addEventListener("click", () => {
    $("delete-confirm").hidden = false;
    $("delete-no").focus();
  });
  $("delete-no").addEventListener("click", () => {
    $("delete-confirm").hidden = true;
    $("delete-start").focus();
  });
  $("delete-yes").addEventListener("click", guarded(deleteMemory));
  $("history-load").addEventListener("click", guarded(loadHistory));
  $("fact-form").addEventListener("submit", guarded(rememberFact));
  $("learn-form").addEventListener("submit", guarded(learn));
  $("profile-form").addEventListener("submit", guarded(loadProfile));
  $("events-refresh").addEventListener("click", guarded(loadEvents));
  $("events-clear").addEventListener("click", guarded(() => {
    sessionStorage.removeItem(EVENTS_STORAGE);
    return loadEvents();
  }));
  $("operator-refresh").addEventListener("click", guarded(loadOperator));
  $("dead-form").addEventListener("submit", guarded(loadDeadLetters));
}

document.addEventListener("DOMContentLoaded", () => start().catch(failed));
