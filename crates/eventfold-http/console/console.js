// The eventfold console: hash-routed pages over the service's own HTTP API.
// No framework and no build step; every value from the service is put in the page as text
// (never as HTML), and the Content-Security-Policy allows no inline script.
'use strict';

const TOKEN_KEY = 'eventfold.console.token';
const PAGES = { cluster: clusterPage, views: viewsPage, query: queryPage, history: historyPage, command: commandPage };

// What the current page started (a timer, a stream), stopped when another page opens.
let current = null;

// ---------------------------------------------------------------- DOM and API helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const $ = (id) => document.getElementById(id);
const token = () => sessionStorage.getItem(TOKEN_KEY);
const json = (v) => JSON.stringify(v, null, 2);

// A 401 anywhere sends the user to the sign-in form; pages stop on this error.
class SignedOut extends Error {}

function authHeaders(extra) {
  const headers = Object.assign({}, extra);
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  return headers;
}

// One API request: {status, ok, body} (body parsed as JSON when it is). 401 signs out.
async function api(path, options) {
  const opts = Object.assign({}, options);
  opts.headers = authHeaders(opts.headers);
  const r = await fetch(path, opts);
  const text = await r.text();
  let body = text;
  try { body = text ? JSON.parse(text) : null; } catch (_) { /* not JSON: keep the text */ }
  if (r.status === 401) {
    showSignIn(token() ? 'The token was refused (401 unauthenticated). Sign in again.' : 'This service needs a bearer token.');
    throw new SignedOut();
  }
  return { status: r.status, ok: r.ok, body, headers: r.headers };
}

// The answer as a plain error line: "403 forbidden: <message>".
function errorBox(a, what) {
  const code = a.body && a.body.error ? a.body.error : '';
  const message = a.body && a.body.message ? a.body.message : (typeof a.body === 'string' ? a.body : '');
  return h('p', { class: 'error', 'data-status': a.status }, `${what}: ${a.status} ${code}${message ? ': ' + message : ''}`);
}

function stateCell(state) {
  return h('td', { class: 'state-' + state }, state);
}

function table(headers, rows, attrs) {
  return h('table', attrs, h('thead', {}, h('tr', {}, headers.map((t) => h('th', {}, t)))), h('tbody', {}, rows));
}

function select(id, options, value) {
  return h('select', { id }, options.map(([v, label]) => h('option', { value: v, selected: v === value }, label)));
}

function hashParams() {
  const q = location.hash.indexOf('?');
  return new URLSearchParams(q < 0 ? '' : location.hash.slice(q + 1));
}

// ---------------------------------------------------------------- sign-in and routing

function showSignIn(reason) {
  stopPage();
  $('page').hidden = true;
  $('page').replaceChildren();
  $('sign-in').hidden = false;
  $('sign-in-reason').textContent = reason;
  $('sign-out').hidden = !token();
  $('who-text').textContent = 'signed out';
}

function stopPage() {
  if (current) current.abort();
  current = null;
}

async function route() {
  stopPage();
  const name = (location.hash.replace(/^#\//, '').split('?')[0]) || 'cluster';
  const render = PAGES[name] || PAGES.cluster;
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('current', a.dataset.page === name);
  current = new AbortController();
  const page = $('page');
  try {
    // Every page first checks that the service takes us (a read of the aggregate types).
    const types = await api('/v1/aggregates');
    if (!types.ok) {
      page.replaceChildren(errorBox(types, 'Listing the aggregate types'));
      page.hidden = false;
      return;
    }
    $('sign-in').hidden = true;
    $('sign-out').hidden = !token();
    $('who-text').textContent = token() ? 'signed in with a token' : 'no authentication';
    page.replaceChildren();
    page.hidden = false;
    await render(page, { signal: current.signal, params: hashParams(), types: types.body.aggregates.map((a) => a.type) });
  } catch (e) {
    if (e instanceof SignedOut || e.name === 'AbortError') return;
    page.append(h('p', { class: 'error' }, 'The console failed: ' + e.message));
    page.hidden = false;
  }
}

// Re-renders part of a page every few seconds while the page is open.
function every(ms, signal, fn) {
  const timer = setInterval(() => fn().catch(() => {}), ms);
  signal.addEventListener('abort', () => clearInterval(timer));
}

// ---------------------------------------------------------------- cluster

async function clusterPage(page, ctx) {
  page.append(h('h2', {}, 'Cluster and partitions'));
  const body = h('div', { id: 'cluster' });
  page.append(body);
  const draw = async () => {
    const a = await api('/v1/cluster', { signal: ctx.signal });
    if (!a.ok) return body.replaceChildren(errorBox(a, 'Reading the cluster (GET /v1/cluster needs the admin role)'));
    const c = a.body;
    const instances = c.instances.map((i) => h('tr', {},
      h('td', {}, i.instance_id + (i.instance_id === c.instance_id ? ' (this one)' : '')), h('td', {}, i.http || '—'),
      h('td', {}, i.alive ? 'yes' : 'no'), h('td', { class: 'num' }, i.generation),
      h('td', {}, Object.entries(i.partitions).map(([t, ps]) => `${t}: ${ps.join(', ')}`).join('; '))));
    const parts = c.partitions.map((p) => h('tr', { 'data-aggregate': p.aggregate, 'data-partition': p.partition },
      h('td', {}, p.aggregate), h('td', { class: 'num' }, p.partition), h('td', {}, p.owner || '—'),
      stateCell(p.state), h('td', { class: 'num' }, Math.round(p.restore_progress * 100) + ' %'),
      h('td', { class: 'num' }, p.queued), h('td', { class: 'num' }, p.commands_lag === undefined ? '—' : p.commands_lag),
      h('td', {}, p.error || '')));
    body.replaceChildren(
      h('p', {}, `Backend ${c.backend}; ${c.restoring} partitions restoring here.`),
      h('h3', {}, 'Instances'),
      table(['instance', 'HTTP', 'alive', 'generation', 'partitions owned'], instances),
      h('h3', {}, 'Partitions'),
      table(['aggregate', 'partition', 'owner', 'state', 'restored', 'queued commands', 'commands lag', 'error'], parts, { id: 'partitions' }),
      h('p', { class: 'note' }, 'Refreshed every 2 s.'));
  };
  await draw();
  every(2000, ctx.signal, draw);
}

// ---------------------------------------------------------------- views and process managers

function viewRow(v) {
  const building = v.building ? `v${v.building.version}: ${v.building.state}, ${v.building.lag} behind` : '—';
  return h('tr', { 'data-view': v.view },
    h('td', {}, v.view), h('td', {}, v.source), h('td', {}, v.scope), stateCell(v.state),
    h('td', { class: 'num' }, v.lag), h('td', { class: 'num' }, v.version), h('td', {}, building),
    h('td', {}, v.applied.map((m) => `p${m.partition}: ${m.offset}`).join(', ')),
    h('td', {}, v.indexes.map((i) => `${i.name} (${i.kind}${i.unique ? ', unique' : ''})`).join(', ') || '—'));
}

function processRow(p) {
  return h('tr', { 'data-process-manager': p.name },
    h('td', {}, p.name), stateCell(p.state), h('td', { class: 'num' }, p.lag), h('td', { class: 'num' }, p.reactions),
    h('td', { class: 'num' }, p.timers_pending), h('td', { class: 'num' }, p.timers_overdue),
    h('td', { class: 'num' }, p.commands_outstanding), h('td', {}, p.error || ''));
}

async function viewsPage(page, ctx) {
  page.append(h('h2', {}, 'Views and process managers'));
  const body = h('div', { id: 'views' });
  page.append(body);
  const draw = async () => {
    const [views, pms] = await Promise.all([
      api('/v1/views', { signal: ctx.signal }), api('/v1/process-managers', { signal: ctx.signal })]);
    body.replaceChildren(
      h('h3', {}, 'Views'),
      views.ok ? table(['view', 'source', 'scope', 'state', 'lag', 'version', 'version being built', 'applied (next offset)', 'indexes'],
        views.body.views.map(viewRow), { id: 'view-table' }) : errorBox(views, 'Listing the views'),
      h('h3', {}, 'Process managers'),
      pms.ok ? table(['process manager', 'state', 'lag', 'reactions', 'timers pending', 'timers overdue', 'commands outstanding', 'error'],
        pms.body.process_managers.map(processRow), { id: 'process-table' }) : errorBox(pms, 'Listing the process managers'),
      h('p', { class: 'note' }, 'Refreshed every 2 s.'));
  };
  await draw();
  every(2000, ctx.signal, draw);
}

// ---------------------------------------------------------------- view query

const CONDITIONS = [['eq', '= equals'], ['gte', '≥ at least'], ['lt', '< below'], ['prefix', 'starts with (string)']];

async function queryPage(page, ctx) {
  page.append(h('h2', {}, 'Query a view'));
  const a = await api('/v1/views', { signal: ctx.signal });
  if (!a.ok) return page.append(errorBox(a, 'Listing the views'));
  const views = a.body.views;
  if (!views.length) return page.append(h('p', {}, 'This service has no views.'));
  const form = h('form', { class: 'bar', id: 'query-form' },
    h('label', {}, 'View', select('q-view', views.map((v) => [v.view, v.view]))),
    h('label', {}, 'Index', h('select', { id: 'q-index' })),
    h('label', {}, 'Condition', select('q-op', CONDITIONS, 'eq')),
    h('label', {}, 'Value', h('input', { id: 'q-value', size: 18 })),
    h('label', {}, 'Order', select('q-order', [['asc', 'ascending'], ['desc', 'descending']], 'asc')),
    h('label', {}, 'Rows per page', h('input', { id: 'q-limit', type: 'number', min: 1, max: 1000, value: 20, size: 5 })),
    h('button', { type: 'submit', id: 'q-run' }, 'Run'));
  const out = h('div', { id: 'query-result' });
  page.append(form, out);
  const fillIndexes = () => {
    const v = views.find((x) => x.view === $('q-view').value);
    $('q-index').replaceChildren(h('option', { value: '' }, '(none: all rows by key)'),
      ...v.indexes.map((i) => h('option', { value: i.name }, `${i.name} (${i.kind})`)));
  };
  $('q-view').addEventListener('change', fillIndexes);
  fillIndexes();
  let pageNo = 0;
  const run = async (cursor) => {
    const view = $('q-view').value;
    const index = $('q-index').value;
    const params = new URLSearchParams();
    if (index && $('q-value').value !== '') {
      const op = $('q-op').value;
      params.set(op === 'eq' ? index : `${index}_${op}`, $('q-value').value);
    } else if (index) {
      params.set('order_by', index);
    }
    params.set('order', $('q-order').value);
    params.set('limit', $('q-limit').value || '20');
    if (cursor) params.set('cursor', cursor);
    pageNo = cursor ? pageNo + 1 : 1;
    const path = `/v1/views/${encodeURIComponent(view)}?${params}`;
    const r = await api(path, { signal: ctx.signal });
    if (!r.ok) return out.replaceChildren(h('p', {}, h('code', {}, 'GET ' + path)), errorBox(r, 'The query'));
    const source = views.find((x) => x.view === view).source;
    const rows = r.body.rows.map((row) => h('tr', { 'data-key': row.key },
      h('td', {}, h('a', { href: `#/history?type=${encodeURIComponent(source)}&id=${encodeURIComponent(row.key)}` }, row.key)),
      h('td', {}, h('pre', {}, json(row.value)))));
    const next = r.body.next_cursor
      ? h('button', { type: 'button', id: 'q-next', onclick: () => run(r.body.next_cursor).catch(() => {}) }, 'Next page')
      : h('span', { class: 'note', id: 'q-last' }, 'Last page.');
    out.replaceChildren(h('p', {}, h('code', {}, 'GET ' + path)),
      h('p', { id: 'q-summary' }, `Page ${pageNo}: ${r.body.rows.length} rows.`),
      table(['key', 'row'], rows, { id: 'rows' }), next);
  };
  form.addEventListener('submit', (e) => { e.preventDefault(); run(null).catch(() => {}); });
}

// ---------------------------------------------------------------- aggregate history (live)

// Reads an SSE stream with fetch, so that the Authorization header goes along (an
// EventSource cannot send it). Calls onEvent({id, event, data}) per event; resumes after
// a dropped connection from the last id seen.
async function follow(url, signal, onEvent, onStatus) {
  let last = null;
  while (!signal.aborted) {
    const headers = authHeaders({ Accept: 'text/event-stream' });
    if (last !== null) headers['Last-Event-ID'] = last;
    let r;
    try { r = await fetch(url, { headers, signal }); } catch (e) { if (signal.aborted) return; }
    if (r && !r.ok) {
      const text = await r.text();
      let body = text; try { body = JSON.parse(text); } catch (_) { /* keep the text */ }
      return onStatus(false, { status: r.status, body });
    }
    if (r) {
      onStatus(true);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value.replace(/\r\n?/g, '\n');
          let end;
          while ((end = buf.indexOf('\n\n')) >= 0) {
            const ev = { id: null, event: 'message', data: '' };
            for (const line of buf.slice(0, end).split('\n')) {
              const colon = line.indexOf(':');
              if (colon === 0) continue; // a keep-alive comment
              const field = colon < 0 ? line : line.slice(0, colon);
              const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
              if (field === 'data') ev.data += (ev.data ? '\n' : '') + value;
              else if (field === 'event') ev.event = value;
              else if (field === 'id') ev.id = value;
            }
            buf = buf.slice(end + 2);
            if (ev.data) { if (ev.id !== null) last = ev.id; onEvent(ev); }
          }
        }
      } catch (e) { if (signal.aborted) return; }
    }
    onStatus(false);
    await new Promise((res) => setTimeout(res, 1000));
  }
}

async function historyPage(page, ctx) {
  page.append(h('h2', {}, "An aggregate's history"));
  const form = h('form', { class: 'bar', id: 'history-form' },
    h('label', {}, 'Aggregate type', select('h-type', ctx.types.map((t) => [t, t]), ctx.params.get('type') || ctx.types[0])),
    h('label', {}, 'Id', h('input', { id: 'h-id', required: true, value: ctx.params.get('id') || '' })),
    h('button', { type: 'submit', id: 'h-show' }, 'Show'));
  const out = h('div', { id: 'history' });
  page.append(form, out);
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    location.hash = `#/history?type=${encodeURIComponent($('h-type').value)}&id=${encodeURIComponent($('h-id').value)}`;
  });
  const type = $('h-type').value;
  const id = ctx.params.get('id');
  if (!id) return;
  const base = `/v1/aggregates/${encodeURIComponent(type)}/${encodeURIComponent(id)}`;
  const live = h('span', { id: 'h-live', class: 'live off' }, 'connecting…');
  const stateBox = h('div', { id: 'h-state' });
  const rows = h('tbody', {});
  out.append(h('p', {}, `${type} `, h('code', {}, id), ' — ', live),
    h('div', { class: 'grid' },
      h('div', {}, h('h3', {}, 'Current state'), stateBox),
      h('div', { class: 'wide' }, h('h3', {}, 'Events'),
        h('table', { id: 'events' }, h('thead', {}, h('tr', {}, ['version', 'type', 'timestamp', 'command id', 'payload'].map((t) => h('th', {}, t)))), rows))));
  const drawState = async () => {
    const s = await api(base, { signal: ctx.signal });
    if (s.status === 404) return stateBox.replaceChildren(h('p', { class: 'note' }, 'No events yet.'));
    if (!s.ok) return stateBox.replaceChildren(errorBox(s, 'Reading the state'));
    stateBox.replaceChildren(h('p', { id: 'h-version' }, `version ${s.body.version}`), h('pre', { id: 'h-state-doc' }, json(s.body.state)));
    return s.body.version;
  };
  // Events past the version shown when the page opened arrived live: marked as such.
  const known = (await drawState()) || 0;
  follow(`${base}/events`, ctx.signal, (ev) => {
    if (ev.event === 'error') return out.append(h('p', { class: 'error' }, 'The stream failed: ' + ev.data));
    const e = JSON.parse(ev.data);
    const fresh = e.version > known;
    rows.append(h('tr', { 'data-version': e.version, class: fresh ? 'fresh' : null },
      h('td', { class: 'num' }, e.version), h('td', {}, e.type), h('td', {}, e.timestamp),
      h('td', {}, h('code', {}, e.command_id)), h('td', {}, h('pre', {}, json(e.payload)))));
    if (fresh) drawState().catch(() => {});
  }, (up, failure) => {
    live.className = up ? 'live' : 'live off';
    live.textContent = up ? '● live' : 'disconnected, retrying…';
    if (failure) { live.textContent = 'not following'; out.append(errorBox(failure, 'Following the events')); }
  }).catch(() => {});
}

// ---------------------------------------------------------------- command form

async function commandPage(page, ctx) {
  page.append(h('h2', {}, 'Send a command'));
  const form = h('form', { id: 'command-form' },
    h('div', { class: 'bar' },
      h('label', {}, 'Aggregate type', select('c-type', ctx.types.map((t) => [t, t]), ctx.params.get('type') || ctx.types[0])),
      h('label', {}, 'Id', h('input', { id: 'c-id', required: true, value: ctx.params.get('id') || '' })),
      h('label', {}, 'Idempotency-Key (optional)', h('input', { id: 'c-key', size: 24 })),
      h('label', {}, 'If-Match version (optional)', h('input', { id: 'c-if-match', size: 8 }))),
    h('label', {}, 'Command (JSON)', h('textarea', { id: 'c-body', spellcheck: 'false' }, '{"type": ""}')),
    h('p', {}, h('button', { type: 'submit', id: 'c-send' }, 'Send')));
  const out = h('div', { id: 'command-result' });
  page.append(form, out);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const type = $('c-type').value;
    const id = $('c-id').value;
    const headers = { 'Content-Type': 'application/json' };
    if ($('c-key').value) headers['Idempotency-Key'] = $('c-key').value;
    if ($('c-if-match').value) headers['If-Match'] = `"${$('c-if-match').value.replace(/"/g, '')}"`;
    $('c-send').disabled = true;
    try {
      const path = `/v1/aggregates/${encodeURIComponent(type)}/${encodeURIComponent(id)}/commands`;
      const r = await api(path, { method: 'POST', headers, body: $('c-body').value, signal: ctx.signal });
      const summary = r.ok
        ? `${r.status} accepted: ${type} ${id} is at version ${r.body.version}`
        : `${r.status} ${r.body && r.body.error ? r.body.error : ''}${r.body && r.body.message ? ': ' + r.body.message : ''}`;
      out.replaceChildren(
        h('p', { id: 'c-status', class: 'status ' + (r.ok ? 'good' : 'bad'), 'data-status': r.status }, summary),
        h('pre', { id: 'c-answer' }, typeof r.body === 'string' ? r.body : json(r.body)),
        r.ok ? h('p', {}, h('a', { href: `#/history?type=${encodeURIComponent(type)}&id=${encodeURIComponent(id)}` }, 'Show its history')) : null);
    } catch (err) {
      if (!(err instanceof SignedOut)) out.replaceChildren(h('p', { class: 'error' }, 'Sending failed: ' + err.message));
    } finally {
      if ($('c-send')) $('c-send').disabled = false;
    }
  });
}

// ---------------------------------------------------------------- start

document.addEventListener('DOMContentLoaded', () => {
  $('sign-in-form').addEventListener('submit', (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim());
    $('token').value = '';
    route();
  });
  $('sign-out').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showSignIn('Signed out.');
    route();
  });
  window.addEventListener('hashchange', route);
  route();
});
