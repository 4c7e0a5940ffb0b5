"""The web page of ``wavetrain serve`` at ``/``: one static HTML file with its script, no build step
and nothing fetched from elsewhere.

Choose or drop a file (or record one with the microphone where the browser allows), and it is
posted to ``/v1/classify``; the answer's predictions are listed (probabilities as bars of their
value; mean log-likelihoods as their difference from the best, the best's bar full and the others
shorter in proportion to their difference, down to the lowest listed) and its per-window segments
drawn over a spectrogram computed in the browser (``decodeAudioData`` at the file's own rate, as
the server's answer gives it, and a small radix-2 FFT), with time (s) and frequency (Hz or kHz)
axes up to the file's Nyquist frequency. The spectrogram is hidden until there is one to
show. A recording is decoded by the browser and posted as a 16-bit wav, which the server reads.

With the ``events`` box ticked the page asks for the events of the sound (``events=1``; the clip
and shift fields, window options, are disabled): each event is drawn over the spectrogram as a
semi-transparent box from its start to its end, labelled with its value, and listed (start, end,
value, score) in place of the windows.

The script's functions between ``// -- pure helpers`` and ``// -- end of pure helpers`` use no
page state (ticks, score bars, number formats); the tests run them in node.
"""
from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>wavetrain serve</title>
<style>
 body { font: 15px/1.4 system-ui, sans-serif; max-width: 960px; margin: 1.5em auto; padding: 0 1em; color: #222; }
 h1 { font-size: 1.3em; margin-bottom: .2em; }
 #model { color: #555; margin-bottom: 1em; }
 #drop { border: 2px dashed #999; border-radius: 8px; padding: 1.2em; text-align: center; }
 #drop.over { background: #eef6ff; border-color: #36c; }
 .row { margin: .6em 0; }
 label { margin-right: 1em; }
 input[type=number] { width: 6em; }
 #status { min-height: 1.4em; color: #555; }
 #status.error { color: #b00; }
 #predictions { list-style: none; padding: 0; }
 #predictions li { margin: .2em 0; display: flex; align-items: center; gap: .6em; }
 #predictions .name { min-width: 10em; font-weight: 600; }
 #predictions .bar { height: .8em; background: #36c; border-radius: 3px; }
 #scorenote { color: #555; font-size: .9em; }
 #specbox { margin: .6em 0; }
 #spec { width: 100%; height: auto; display: block; }
 #speccaption { color: #555; font-size: .9em; }
 table { border-collapse: collapse; margin-top: .6em; }
 td, th { border-bottom: 1px solid #ddd; padding: .2em .6em; text-align: left; }
 .anomaly { color: #b00; font-weight: 600; }
 input:disabled { color: #999; }
</style>
</head>
<body>
<h1>wavetrain</h1>
<div id="model">loading the model&hellip;</div>
<div id="drop">
  <div class="row">Drop an audio file here (wav, flac, ogg) or
    <input type="file" id="file" accept="audio/*,.wav,.flac,.ogg"></div>
  <div class="row"><button id="record" type="button" disabled>record</button>
    <span id="recnote"></span></div>
</div>
<div class="row">
  <label>top k <input type="number" id="topk" min="1" value="5"></label>
  <label>clip ms <input type="number" id="clip" min="0" placeholder="model's"></label>
  <label>shift ms <input type="number" id="shift" min="0" placeholder="model's"></label>
  <label title="where each sound starts and ends, each answered as a whole (instead of windows)"><input
    type="checkbox" id="events"> events</label>
</div>
<div id="status"></div>
<ul id="predictions"></ul>
<div id="scorenote"></div>
<figure id="specbox" hidden>
  <canvas id="spec" width="900" height="300"></canvas>
  <figcaption id="speccaption"></figcaption>
</figure>
<table id="segments"></table>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let modelInfo = null;

function setStatus(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

// -- pure helpers (no page state; tests/serve/test_page.py runs them in node) --
function fmt(x) {
  if (x === null || x === undefined) return "\\u2013";
  return Math.abs(x) >= 100 || (Math.abs(x) < 0.01 && x !== 0) ? x.toPrecision(4) : x.toFixed(3);
}

// evenly spaced round values (1, 2 or 5 times a power of ten) from 0 to top, at most about n of them,
// with their labels (as many decimals as the step needs)
function ticks(top, n) {
  if (!(top > 0)) return [];
  const raw = top / Math.max(1, n), p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * p).find((st) => st >= raw);
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const out = [];
  for (let i = 0; i * step <= top * (1 + 1e-9); i++) out.push({value: i * step, text: (i * step).toFixed(decimals)});
  return out;
}

// the time axis (seconds) of a plot px pixels wide: a label every 70 px or more
function timeTicks(duration, px) {
  return {label: "time (s)", ticks: ticks(duration, Math.max(2, Math.floor(px / 70)))};
}

// the frequency axis of a plot px pixels tall, up to top Hz: in kHz from 2 kHz up, else Hz
function freqTicks(top, px) {
  const k = top >= 2000, scale = k ? 1000 : 1;
  const t = ticks(top / scale, Math.max(2, Math.floor(px / 40)));
  return {label: k ? "frequency (kHz)" : "frequency (Hz)",
          ticks: t.map((x) => ({value: x.value * scale, text: x.text}))};
}

// the bars of an answer's predictions: width in [0, 1], the text beside it, its tooltip
function scoreBars(predictions, kind) {
  if (kind === "mean_loglik") {
    const known = predictions.filter((p) => p.score !== null && p.score !== undefined).map((p) => p.score);
    const best = known.length ? Math.max(...known) : null, worst = known.length ? Math.min(...known) : null;
    return predictions.map((p) => {
      if (p.score === null || p.score === undefined || best === null) return {width: 0, text: fmt(null), title: ""};
      const d = p.score - best;
      return {width: best > worst ? 1 + d / (best - worst) : 1,
              text: d === 0 ? "0 (best)" : fmt(d).replace("-", "\\u2212"),
              title: `mean log-likelihood ${fmt(p.score)}`};
    });
  }
  if (kind === "probability") {
    return predictions.map((p) => ({width: p.score === null ? 0 : Math.max(0, Math.min(1, p.score)),
                                    text: fmt(p.score), title: ""}));
  }
  return predictions.map((p) => ({width: null, text: fmt(p.score), title: ""}));
}

// how much of a spectrogram decoded at decodedRate to draw for a file at fileRate: up to the file's
// own Nyquist frequency (top, Hz) and that share of the decoded bins (a browser that could not decode
// at the file's rate resamples it, and shows nothing above the file's Nyquist)
function spectrumTop(fileRate, decodedRate) {
  const decoded = decodedRate / 2, own = fileRate > 0 ? fileRate / 2 : decoded;
  const top = Math.min(own, decoded);
  return {top, share: top / decoded};
}

// an event's score (an answer's JSON: its anomaly score, probability or mean log-likelihood)
function eventScore(ev) {
  for (const k of ["anomaly_score", "confidence", "loglik"]) if (ev[k] !== undefined) return ev[k];
  return ev.scores && ev.scores[ev.value] !== undefined ? ev.scores[ev.value] : null;
}

// the boxes of events over a plot (left, width pixels) of a sound lasting durationMs: from each
// event's start to its end (at least one pixel wide), labelled with its value
function eventBoxes(events, durationMs, left, width) {
  if (!(durationMs > 0)) return [];
  return events.map((ev) => {
    const x0 = left + width * Math.max(0, ev.start_ms) / durationMs;
    const x1 = Math.max(x0 + 1, Math.min(left + width, left + width * ev.end_ms / durationMs));
    return {x0, x1, text: ev.value, anomaly: ev.anomaly === true};
  });
}
// -- end of pure helpers --

async function loadModel() {
  try {
    const r = await fetch("/v1/model");
    modelInfo = await r.json();
    const m = modelInfo;
    const name = m.preset ? `${m.preset} (${m.family})` : m.family;
    $("model").textContent = `${m.id} \\u2014 ${name}` + (m.detector ? " anomaly detector" : " classifier") +
      ` of ${m.label}: ${m.labels.join(", ")} (scores: ${m.score_kind})`;
  } catch (e) {
    $("model").textContent = "the model could not be loaded: " + e;
  }
}

function query() {
  const q = new URLSearchParams();
  for (const [id, name] of [["topk", "top_k"], ["clip", "clip_ms"], ["shift", "clip_shift_ms"]]) {
    if ($(id).value !== "" && !$(id).disabled) q.set(name, $(id).value);
  }
  if ($("events").checked) q.set("events", "1");
  return q.toString();
}

// events are answered as a whole: the window options do not apply to them
function eventsToggled() {
  for (const id of ["clip", "shift"]) $(id).disabled = $("events").checked;
}

async function classify(blob, name) {
  document.body.dataset.state = "busy";
  setStatus(`classifying ${name}\\u2026`);
  $("predictions").innerHTML = "";
  $("segments").innerHTML = "";
  $("scorenote").textContent = "";
  $("specbox").hidden = true;
  let res;
  try {
    const form = new FormData();
    form.append("file", blob, name);
    const r = await fetch("/v1/classify?" + query(), {method: "POST", body: form});
    res = await r.json();
    if (!r.ok) throw new Error(`${r.status}: ${res.error}`);
  } catch (e) {
    setStatus(String(e.message || e), true);
    document.body.dataset.state = "error";
    return;
  }
  showResult(res, name);
  document.body.dataset.state = "done";
  try {
    const audio = await decode(await blob.arrayBuffer(), res.sample_rate);
    drawSpectrogram(audio, res);
    $("specbox").hidden = false;
  } catch (e) {
    setStatus($("status").textContent + " (no spectrogram: " + (e.message || e) + ")");
  }
}

function showResult(res, name) {
  const t = res.timings;
  const found = res.events ? `${res.events.length} event(s)` : `${res.windows} window(s)`;
  setStatus(`${name}: ${res.duration_s.toFixed(2)} s, ${found}; decode ${fmt(t.decode_ms)} ms, ` +
            `features ${fmt(t.features_ms)} ms, inference ${fmt(t.inference_ms)} ms`);
  if (res.events) {
    showEvents(res);
    return;
  }
  const ul = $("predictions");
  const bars = scoreBars(res.predictions, res.score_kind);
  res.predictions.forEach((p, i) => {
    const li = document.createElement("li");
    const n = document.createElement("span");
    n.className = "name" + (p.label === "anomaly" ? " anomaly" : "");
    n.textContent = p.label;
    const s = document.createElement("span");
    s.className = "value";
    s.textContent = bars[i].text;
    if (bars[i].title) s.title = bars[i].title;
    li.append(n);
    if (bars[i].width !== null) {
      const bar = document.createElement("span");
      bar.className = "bar";
      bar.style.width = Math.max(2, 300 * bars[i].width) + "px";
      li.append(bar);
    }
    li.append(s);
    ul.append(li);
  });
  if (res.score_kind === "mean_loglik") {
    $("scorenote").textContent = "scores: mean log-likelihood per frame, as the difference from the best " +
      "(hover for the value); bars: the best full, the others shorter by their difference, down to the lowest listed";
  }
  if (res.anomaly !== undefined) {
    const li = document.createElement("li");
    li.textContent = `anomaly score ${fmt(res.anomaly_score)}, threshold ${fmt(res.threshold)}`;
    ul.append(li);
  }
  const table = $("segments");
  const head = table.insertRow();
  for (const h of ["start ms", "end ms", "answer", "top scores"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  for (const seg of res.segments) {
    const row = table.insertRow();
    row.insertCell().textContent = seg.start_ms;
    row.insertCell().textContent = seg.end_ms;
    const a = row.insertCell();
    a.textContent = seg.label;
    if (seg.anomaly) a.className = "anomaly";
    row.insertCell().textContent = seg.predictions.map((p) => `${p.label} ${fmt(p.score)}`).join(", ");
  }
}

// the events of an answer, listed in place of the windows: start and end (s), value, score
function showEvents(res) {
  const table = $("segments");
  const head = table.insertRow();
  for (const h of ["start s", "end s", "value", "score"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  for (const ev of res.events) {
    const row = table.insertRow();
    row.insertCell().textContent = (ev.start_ms / 1000).toFixed(2);
    row.insertCell().textContent = (ev.end_ms / 1000).toFixed(2);
    const a = row.insertCell();
    a.textContent = ev.value;
    if (ev.anomaly) a.className = "anomaly";
    row.insertCell().textContent = fmt(eventScore(ev));
  }
  if (!res.events.length) {
    $("scorenote").textContent = "no events: silence or a steady background only";
  } else if (res.score_kind === "mean_loglik") {
    $("scorenote").textContent = "scores: mean log-likelihood per frame of each event's answer";
  }
}

// decode at the file's own rate where the browser can (else at 22,050 Hz, resampled)
function decode(buffer, rate) {
  const Ctx = window.OfflineAudioContext || window.webkitOfflineAudioContext;
  let ctx;
  try { ctx = new Ctx(1, 1, rate || 22050); } catch (e) { ctx = new Ctx(1, 1, 22050); }
  return new Promise((ok, fail) => ctx.decodeAudioData(buffer, ok, fail));
}

// in-place radix-2 FFT of (re, im), length a power of two
function fft(re, im) {
  const n = re.length;
  for (let i = 1, j = 0; i < n; i++) {
    let bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) { [re[i], re[j]] = [re[j], re[i]]; [im[i], im[j]] = [im[j], im[i]]; }
  }
  for (let len = 2; len <= n; len <<= 1) {
    const ang = -2 * Math.PI / len, wr = Math.cos(ang), wi = Math.sin(ang);
    for (let i = 0; i < n; i += len) {
      let cr = 1, ci = 0;
      for (let k = 0; k < len / 2; k++) {
        const a = i + k, b = a + len / 2;
        const xr = re[b] * cr - im[b] * ci, xi = re[b] * ci + im[b] * cr;
        re[b] = re[a] - xr; im[b] = im[a] - xi; re[a] += xr; im[a] += xi;
        const t = cr * wr - ci * wi; ci = cr * wi + ci * wr; cr = t;
      }
    }
  }
}

function spectrogram(x, nfft, cols) {
  const hop = Math.max(1, Math.floor((x.length - nfft) / Math.max(1, cols - 1)));
  const n = Math.max(1, Math.min(cols, Math.floor((x.length - nfft) / hop) + 1));
  const win = new Float32Array(nfft).map((_, i) => 0.5 - 0.5 * Math.cos(2 * Math.PI * i / nfft));
  const out = [];
  const re = new Float32Array(nfft), im = new Float32Array(nfft);
  for (let c = 0; c < n; c++) {
    im.fill(0);
    for (let i = 0; i < nfft; i++) re[i] = (x[c * hop + i] || 0) * win[i];
    fft(re, im);
    const col = new Float32Array(nfft / 2);
    for (let k = 0; k < nfft / 2; k++) col[k] = 10 * Math.log10(re[k] * re[k] + im[k] * im[k] + 1e-10);
    out.push(col);
  }
  return out;
}

// the plot's margins in the canvas (pixels): tick labels and axis titles are drawn in them
const MARGIN = {left: 58, right: 12, top: 8, bottom: 40};

function drawSpectrogram(audio, res) {
  const canvas = $("spec"), g = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height;
  delete canvas.dataset.events;
  const L = MARGIN.left, T = MARGIN.top, PW = W - L - MARGIN.right, PH = H - T - MARGIN.bottom;
  g.fillStyle = "#fff";
  g.fillRect(0, 0, W, H);
  const x = audio.getChannelData(0);
  const cols = spectrogram(x, 512, PW);
  const shown = spectrumTop(res.sample_rate, audio.sampleRate);
  const bins = Math.max(1, Math.round(cols[0].length * shown.share));
  let top = -Infinity;
  for (const c of cols) for (let k = 0; k < bins; k++) top = Math.max(top, c[k]);
  const img = g.createImageData(PW, PH);
  for (let px = 0; px < PW; px++) {
    const c = cols[Math.min(cols.length - 1, Math.floor(px * cols.length / PW))];
    for (let py = 0; py < PH; py++) {
      const k = Math.floor((PH - 1 - py) * bins / PH);
      const v = Math.max(0, Math.min(1, (c[k] - top + 80) / 80));
      const o = 4 * (py * PW + px);
      img.data[o] = 255 * Math.min(1, 2 * v); img.data[o + 1] = 255 * Math.max(0, 2 * v - 1);
      img.data[o + 2] = 90 * (1 - v) + 40; img.data[o + 3] = 255;
    }
  }
  g.putImageData(img, L, T);
  drawAxes(g, audio.duration, shown.top, L, T, PW, PH);
  const range = `spectrogram: 0\\u2013${audio.duration.toFixed(2)} s, ` +
    `0\\u2013${+(shown.top / 1000).toFixed(3)} kHz (the file's ${res.sample_rate} Hz` +
    (audio.sampleRate === res.sample_rate ? "" : `, decoded by the browser at ${audio.sampleRate} Hz`) + "); boxes: ";
  const total = 1000 * audio.duration;
  g.font = "13px system-ui, sans-serif";
  g.textAlign = "left";
  g.textBaseline = "alphabetic";
  if (res.events) {
    drawEvents(g, res.events, total, L, T, PW, PH);
    $("speccaption").textContent = range + "the events found and their answers";
    return;
  }
  for (const seg of res.segments) {
    const x0 = L + PW * seg.start_ms / total, x1 = Math.min(L + PW, L + PW * seg.end_ms / total);
    g.strokeStyle = seg.anomaly ? "#f44" : "#fff";
    g.strokeRect(x0 + 0.5, T + 0.5, Math.max(1, x1 - x0 - 1), PH - 1);
    g.fillStyle = "rgba(0,0,0,.55)";
    g.fillRect(x0 + 1, T + 1, Math.max(1, x1 - x0 - 2), 18);
    g.fillStyle = seg.anomaly ? "#f88" : "#fff";
    g.fillText(`${seg.label} ${fmt(seg.predictions[0].score)}`, x0 + 4, T + 14, Math.max(10, x1 - x0 - 8));
  }
  $("speccaption").textContent = range + "the model's windows and their answers";
}

// each event a semi-transparent box over the whole height of the plot (L, T, PW, PH), its value
// above; the boxes' pixel spans are also left on the canvas (data-events) for tools and tests
function drawEvents(g, events, total, L, T, PW, PH) {
  const boxes = eventBoxes(events, total, L, PW);
  for (const b of boxes) {
    g.fillStyle = b.anomaly ? "rgba(255,70,70,.3)" : "rgba(120,200,255,.3)";
    g.fillRect(b.x0, T, b.x1 - b.x0, PH);
    g.strokeStyle = b.anomaly ? "#f44" : "#bdf";
    g.strokeRect(b.x0 + 0.5, T + 0.5, Math.max(1, b.x1 - b.x0 - 1), PH - 1);
    g.fillStyle = "rgba(0,0,0,.55)";
    g.fillRect(b.x0 + 1, T + 1, Math.max(1, b.x1 - b.x0 - 2), 18);
    g.fillStyle = b.anomaly ? "#f88" : "#fff";
    g.fillText(b.text, b.x0 + 4, T + 14, Math.max(10, b.x1 - b.x0 - 8));
  }
  g.canvas.dataset.events = boxes.map((b) => `${Math.round(b.x0)}-${Math.round(b.x1)}:${b.text}`).join(" ");
}

// the time axis below the plot (L, T, PW, PH) and the frequency axis left of it, ticks labelled;
// the tick labels are also left on the canvas (data-xticks, data-yticks) for tools and tests
function drawAxes(g, duration, nyquist, L, T, PW, PH) {
  const canvas = g.canvas, xs = timeTicks(duration, PW), ys = freqTicks(nyquist, PH);
  g.strokeStyle = "#444";
  g.fillStyle = "#222";
  g.lineWidth = 1;
  g.font = "12px system-ui, sans-serif";
  g.strokeRect(L - 0.5, T - 0.5, PW + 1, PH + 1);
  g.textAlign = "center";
  g.textBaseline = "top";
  for (const t of xs.ticks) {
    const px = Math.round(L + PW * t.value / duration) + 0.5;
    g.beginPath(); g.moveTo(px, T + PH); g.lineTo(px, T + PH + 5); g.stroke();
    g.fillText(t.text, px, T + PH + 7);
  }
  g.fillText(xs.label, L + PW / 2, T + PH + 23);
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (const t of ys.ticks) {
    const py = Math.round(T + PH - PH * t.value / nyquist) + 0.5;
    g.beginPath(); g.moveTo(L - 5, py); g.lineTo(L, py); g.stroke();
    g.fillText(t.text, L - 7, py);
  }
  g.save();
  g.translate(12, T + PH / 2);
  g.rotate(-Math.PI / 2);
  g.textAlign = "center";
  g.fillText(ys.label, 0, 0);
  g.restore();
  canvas.dataset.xticks = xs.ticks.map((t) => t.text).join(" ");
  canvas.dataset.yticks = ys.ticks.map((t) => t.text).join(" ");
  canvas.dataset.xlabel = xs.label;
  canvas.dataset.ylabel = ys.label;
}

// a decoded recording as a 16-bit mono wav
function wav(audio) {
  const x = audio.getChannelData(0), rate = audio.sampleRate;
  const buf = new ArrayBuffer(44 + 2 * x.length), v = new DataView(buf);
  const str = (o, s) => { for (let i = 0; i < s.length; i++) v.setUint8(o + i, s.charCodeAt(i)); };
  str(0, "RIFF"); v.setUint32(4, 36 + 2 * x.length, true); str(8, "WAVE"); str(12, "fmt ");
  v.setUint32(16, 16, true); v.setUint16(20, 1, true); v.setUint16(22, 1, true); v.setUint32(24, rate, true);
  v.setUint32(28, 2 * rate, true); v.setUint16(32, 2, true); v.setUint16(34, 16, true); str(36, "data");
  v.setUint32(40, 2 * x.length, true);
  for (let i = 0; i < x.length; i++) v.setInt16(44 + 2 * i, Math.max(-1, Math.min(1, x[i])) * 32767, true);
  return new Blob([buf], {type: "audio/wav"});
}

let recorder = null;
function setupRecording() {
  const button = $("record");
  if (!(navigator.mediaDevices && navigator.mediaDevices.getUserMedia && window.MediaRecorder)) {
    $("recnote").textContent = "(recording is not available in this browser or without https)";
    return;
  }
  button.disabled = false;
  button.onclick = async () => {
    if (recorder) { recorder.stop(); return; }
    try {
      const stream = await navigator.mediaDevices.getUserMedia({audio: true});
      const chunks = [];
      recorder = new MediaRecorder(stream);
      recorder.ondataavailable = (e) => chunks.push(e.data);
      recorder.onstop = async () => {
        stream.getTracks().forEach((t) => t.stop());
        recorder = null;
        button.textContent = "record";
        try {
          const audio = await decode(await new Blob(chunks).arrayBuffer());
          await classify(wav(audio), "recording.wav");
        } catch (e) { setStatus("the recording could not be decoded: " + (e.message || e), true); }
      };
      recorder.start();
      button.textContent = "stop";
      setStatus("recording\\u2026 press stop to classify");
    } catch (e) { setStatus("no microphone: " + (e.message || e), true); }
  };
}

$("events").addEventListener("change", eventsToggled);
eventsToggled();
$("file").addEventListener("change", (e) => {
  const f = e.target.files[0];
  if (f) classify(f, f.name);
});
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  const f = e.dataTransfer.files[0];
  if (f) classify(f, f.name);
});
setupRecording();
loadModel();
</script>
</body>
</html>
"""


def _csp_hash(tag: str) -> str:
    import base64
    import hashlib

    text = PAGE.split(f"<{tag}>", 1)[1].split(f"</{tag}>", 1)[0]
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


#: The page's Content-Security-Policy: its own inline script and style (by hash) and requests to
#: this server only; no frames, no forms, no plug-ins.
PAGE_CSP = (f"default-src 'none'; script-src {_csp_hash('script')}; style-src {_csp_hash('style')}; "
            "connect-src 'self'; img-src 'self' data: blob:; media-src 'self' blob: mediastream:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
