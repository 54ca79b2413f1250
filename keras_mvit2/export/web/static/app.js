// The page of `mvit2 web`: an exported .tflite in MediaPipe Tasks for the web.
// config.json (written by keras_mvit2.export.web.site) names the model, its task and
// classes; the runtime lies in ./mediapipe/ (no CDN: the page works offline).
// window.mvit2 is the interface the Python driver (keras_mvit2.export.web.browser) uses.
import {ImageClassifier, ImageSegmenter, ObjectDetector} from './mediapipe/vision_bundle.mjs';

const $ = (id) => document.getElementById(id);
const here = (path) => new URL(path, location.href).href;
const FILESET = {
  wasmLoaderPath: here('mediapipe/vision_wasm_internal.js'),
  wasmBinaryPath: here('mediapipe/vision_wasm_internal.wasm'),
};
const COLORS = [[230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48],
  [145, 30, 180], [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 212],
  [0, 128, 128], [170, 110, 40]];

async function createTask(config, delegate) {
  const baseOptions = {modelAssetPath: here(config.model), delegate};
  if (config.task === 'detector') {
    return ObjectDetector.createFromOptions(FILESET, {baseOptions, maxResults: -1, scoreThreshold: 0});
  }
  if (config.task === 'segmenter') {
    return ImageSegmenter.createFromOptions(FILESET, {baseOptions, outputCategoryMask: true,
      outputConfidenceMasks: true});
  }
  return ImageClassifier.createFromOptions(FILESET, {baseOptions, maxResults: -1, scoreThreshold: 0});
}

// One image through the task: a plain object (masks copied out, MediaPipe's freed).
function infer(task, kind, image) {
  const start = performance.now();
  let out;
  if (kind === 'detector') {
    const result = task.detect(image);
    out = {detections: result.detections.map((d) => ({
      box: [d.boundingBox.originX, d.boundingBox.originY,
        d.boundingBox.originX + d.boundingBox.width, d.boundingBox.originY + d.boundingBox.height],
      index: d.categories[0].index, score: d.categories[0].score,
      name: d.categories[0].categoryName || d.categories[0].displayName || ''}))};
  } else if (kind === 'segmenter') {
    const result = task.segment(image);
    out = {mask: result.categoryMask.getAsUint8Array().slice(),
      confidence: result.confidenceMasks.map((m) => m.getAsFloat32Array().slice()),
      width: result.categoryMask.width, height: result.categoryMask.height};
    result.close();
  } else {
    const result = task.classify(image);
    out = {categories: result.classifications[0].categories.map((c) => ({
      index: c.index, score: c.score, name: c.categoryName || c.displayName || ''}))};
  }
  out.ms = performance.now() - start;
  return out;
}

function fromBase64(text) {
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

function toBase64(bytes) {
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(text);
}

// RGB uint8 (n, h, w, 3), base64 -> ImageData per image (exact pixels, no decoding).
function imagesFromRgb(b64, n, h, w) {
  const rgb = fromBase64(b64);
  const images = [];
  for (let i = 0; i < n; i++) {
    const rgba = new Uint8ClampedArray(h * w * 4);
    for (let p = 0, q = i * h * w * 3; p < h * w; p++, q += 3) {
      rgba[4 * p] = rgb[q]; rgba[4 * p + 1] = rgb[q + 1]; rgba[4 * p + 2] = rgb[q + 2];
      rgba[4 * p + 3] = 255;
    }
    images.push(new ImageData(rgba, w, h));
  }
  return images;
}

function describe(config) {
  const size = config.input_size.join('x');
  const names = config.class_names ? `${config.class_names.length} classes` : 'no class names';
  return `${config.model_name}: ${config.task}, ${config.quantization || '?'}, ${size} input, ` +
    `${names}; ${config.runtime}`;
}

function draw(config, image, out) {
  const canvas = $('canvas');
  const width = image.displayWidth || image.videoWidth || image.width;
  const height = image.displayHeight || image.videoHeight || image.height;
  canvas.width = width; canvas.height = height;
  const ctx = canvas.getContext('2d');
  if (image instanceof ImageData) ctx.putImageData(image, 0, 0); else ctx.drawImage(image, 0, 0);
  const list = $('labels');
  list.replaceChildren();
  const item = (text, score, color) => {
    const li = document.createElement('li');
    li.textContent = score === undefined ? text : `${text} ${score.toFixed(3)}`;
    if (color) {
      const swatch = document.createElement('span');
      swatch.className = 'swatch'; swatch.style.background = `rgb(${color.join(',')})`;
      li.prepend(swatch);
    }
    if (score !== undefined) {
      const bar = document.createElement('span');
      bar.className = 'bar'; bar.style.width = `${Math.round(80 * score)}px`;
      li.append(bar);
    }
    list.append(li);
  };
  if (config.task === 'classifier') {
    for (const c of out.categories.slice(0, 5)) item(c.name || `class ${c.index}`, c.score);
  } else if (config.task === 'detector') {
    ctx.lineWidth = Math.max(1, width / 128);
    ctx.font = `${Math.max(8, width / 16)}px sans-serif`;
    out.detections.forEach((d) => {
      const [r, g, b] = COLORS[Math.max(0, d.index) % COLORS.length];
      ctx.strokeStyle = ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.strokeRect(d.box[0], d.box[1], d.box[2] - d.box[0], d.box[3] - d.box[1]);
      ctx.fillText(d.name, d.box[0] + 1, d.box[1] + ctx.lineWidth + width / 16);
      item(d.name || `class ${d.index}`, d.score);
    });
    if (!out.detections.length) item('no detections');
  } else {
    const overlay = ctx.getImageData(0, 0, width, height);
    const seen = new Set();
    for (let y = 0; y < height; y++) {
      for (let x = 0; x < width; x++) {
        const label = out.mask[Math.floor(y * out.height / height) * out.width +
          Math.floor(x * out.width / width)];
        seen.add(label);
        if (label === 0) continue;
        const [r, g, b] = COLORS[label % COLORS.length];
        const p = 4 * (y * width + x);
        overlay.data[p] = (overlay.data[p] + r) / 2;
        overlay.data[p + 1] = (overlay.data[p + 1] + g) / 2;
        overlay.data[p + 2] = (overlay.data[p + 2] + b) / 2;
      }
    }
    ctx.putImageData(overlay, 0, 0);
    for (const label of [...seen].sort((a, b) => a - b)) {
      item((config.class_names || [])[label] || `class ${label}`, undefined,
        label === 0 ? null : COLORS[label % COLORS.length]);
    }
  }
  $('latency').textContent = `${out.ms.toFixed(1)} ms (${config.task}, in this browser)`;
}

async function main() {
  const params = new URLSearchParams(location.search);
  const config = await (await fetch('config.json')).json();
  const kind = config.task;
  const task = await createTask(config, params.get('delegate') === 'GPU' ? 'GPU' : 'CPU');
  $('model-info').textContent = describe(config);
  const show = async (source) => {
    const image = source instanceof Blob ? await createImageBitmap(source) : source;
    draw(config, image, infer(task, kind, image));
  };
  // Files dropped, picked one by one or as a folder.
  const takeFiles = (files) => {
    const images = [...files].filter((f) => f.type.startsWith('image/'));
    images.forEach((file) => addThumbnail(URL.createObjectURL(file), show));
    if (images.length) show(images[0]);
  };
  const drop = $('drop');
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => {
    e.preventDefault(); drop.classList.remove('over'); takeFiles(e.dataTransfer.files);
  });
  $('pick-files').addEventListener('change', (e) => takeFiles(e.target.files));
  $('pick-folder').addEventListener('change', (e) => takeFiles(e.target.files));
  // The server's --images folder.
  for (const url of config.images || []) addThumbnail(url, show);
  // The camera, where there is one.
  if (navigator.mediaDevices && navigator.mediaDevices.getUserMedia) {
    const button = $('camera');
    button.hidden = false;
    button.addEventListener('click', async () => {
      const video = $('video');
      video.srcObject = await navigator.mediaDevices.getUserMedia({video: true});
      await video.play();
      const frame = () => { if (video.videoWidth) draw(config, video, infer(task, kind, video)); requestAnimationFrame(frame); };
      frame();
    });
  }
  window.mvit2 = {
    config,
    // RGB uint8 images, base64 of (n, h, w, 3): one result per image (masks as base64).
    runBatch(b64, n, h, w) {
      return imagesFromRgb(b64, n, h, w).map((image) => {
        const out = infer(task, kind, image);
        if (out.mask) {
          out.mask = toBase64(out.mask);
          out.confidence = out.confidence.map((m) => toBase64(new Uint8Array(m.buffer)));
        }
        return out;
      });
    },
    // Shows one image and its result on the page (for a screenshot).
    show(b64, h, w) {
      const image = imagesFromRgb(b64, 1, h, w)[0];
      draw(config, image, infer(task, kind, image));
      return $('labels').textContent;
    },
    // Milliseconds of `runs` inferences on one image, after `warmup` untimed ones.
    bench(b64, h, w, runs, warmup) {
      const image = imagesFromRgb(b64, 1, h, w)[0];
      for (let i = 0; i < warmup; i++) infer(task, kind, image);
      const times = [];
      for (let i = 0; i < runs; i++) times.push(infer(task, kind, image).ms);
      return times;
    },
    userAgent: navigator.userAgent,
  };
  return config;
}

function addThumbnail(url, show) {
  const img = document.createElement('img');
  img.src = url;
  img.alt = url.split('/').pop();
  img.title = img.alt;
  img.addEventListener('click', () => show(img));
  $('gallery').append(img);
}

window.mvit2Ready = main().catch((error) => {
  $('model-info').textContent = `Could not load the model: ${error}`;
  throw error;
});
