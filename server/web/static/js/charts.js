// Small hand-drawn canvas charts: a few shapes of data, so no charting library is vendored.

export function color(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(`--${name}`).trim();
}

// The canvas sized to its box in device pixels; returns its context and size in CSS pixels.
function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = Number(canvas.getAttribute("height"));
  if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
  canvas.style.height = `${height}px`;
  canvas.height = Math.round(height * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, width, height };
}

function axisLabel(ctx, text, x, y) {
  ctx.fillStyle = color("muted");
  ctx.fillText(text, x, y);
}

// One bar per step, newest at the right: segments stacked bottom-up in `series` order, each
// {key, colour, alpha}; a step with `mark(step)` true gets a ✕ above it.
export function stackedBars(canvas, steps, series, mark) {
  const { ctx, width, height } = prepare(canvas);
  const top = 14;
  const max = Math.max(1, ...steps.map((s) => series.reduce((sum, k) => sum + s[k.key], 0)));
  const slot = width / Math.max(steps.length, 60);
  steps.forEach((step, i) => {
    const x = width - (steps.length - i) * slot;
    let y = height;
    for (const part of series) {
      const h = (step[part.key] / max) * (height - top);
      ctx.globalAlpha = part.alpha ?? 1;
      ctx.fillStyle = part.colour;
      ctx.fillRect(x + 1, y - h, Math.max(1, slot - 2), h);
      y -= h;
    }
    ctx.globalAlpha = 1;
    if (mark(step)) {
      ctx.fillStyle = color("error");
      ctx.fillText("✕", x + slot / 2 - 3, top - 2);
    }
  });
  axisLabel(ctx, `max ${max} tokens/step`, 4, 11);
}

// Lines over the same x positions: each {values, colour, label}; `target` a dashed level.
export function lines(canvas, series, { target = null, unit = "" } = {}) {
  const { ctx, width, height } = prepare(canvas);
  const n = Math.max(2, ...series.map((s) => s.values.length));
  const all = series.flatMap((s) => s.values.filter((v) => v !== null));
  const max = Math.max(1e-9, target ?? 0, ...all) * 1.1;
  const y = (v) => height - (v / max) * (height - 16);
  for (const s of series) {
    ctx.strokeStyle = s.colour;
    ctx.fillStyle = s.colour;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      const x = (i / (n - 1)) * width;
      if (v === null) { pen = false; return; }
      if (s.dots) ctx.fillRect(x - 2, y(v) - 2, 4, 4);
      else if (pen) ctx.lineTo(x, y(v));
      else ctx.moveTo(x, y(v));
      pen = true;
    });
    if (!s.dots) ctx.stroke();
  }
  if (target !== null) {
    ctx.setLineDash([5, 4]);
    ctx.strokeStyle = color("muted");
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(0, y(target));
    ctx.lineTo(width, y(target));
    ctx.stroke();
    ctx.setLineDash([]);
  }
  const legend = series.map((s) => `${s.label} ${s.last ?? ""}`).join("   ");
  axisLabel(ctx, `${legend}   (top ${max.toFixed(max < 10 ? 1 : 0)}${unit})`, 4, 11);
}

// One horizontal bar split into parts {value, colour, label}.
export function splitBar(canvas, parts) {
  const { ctx, width, height } = prepare(canvas);
  const total = parts.reduce((sum, p) => sum + p.value, 0) || 1;
  let x = 0;
  for (const p of parts) {
    const w = (p.value / total) * width;
    ctx.fillStyle = p.colour;
    ctx.fillRect(x, 0, w, height);
    if (w > 60) {
      ctx.fillStyle = "#fff";
      ctx.fillText(`${p.label} ${p.value}`, x + 6, height / 2 + 4);
    }
    x += w;
  }
}
