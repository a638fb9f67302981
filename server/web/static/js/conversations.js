// Conversations kept on the server (/v1/web/conversations, in the data directory): listed,
// renamed, deleted. Without a server store (no data directory) they live in this tab only.

import { ApiError, getJson, request } from "./api.js";
import { $, el } from "./dom.js";

const BASE = "/v1/web/conversations";

export class Conversations {
  constructor({ onOpen }) {
    this.onOpen = onOpen;  // called with the conversation object chosen in the list
    this.serverSide = true;
    this.currentId = null;
    $("new-conversation").addEventListener("click", () => {
      this.currentId = null;
      this.onOpen(null);
      this.render(this.items);
    });
    this.items = [];
  }

  async refresh() {
    try {
      this.items = (await getJson(BASE)).data;
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      this.serverSide = false;
      $("conversations-note").textContent = "This server keeps no conversations (no data directory): they last as long as the tab.";
    }
    this.render(this.items);
  }

  async create(title, messages, settings) {
    if (!this.serverSide) return { id: null, title, messages, settings };
    const made = await getJson(BASE, { method: "POST", json: { title, messages, settings } });
    this.currentId = made.id;
    await this.refresh();
    return made;
  }

  async save(id, fields) {
    if (!this.serverSide || !id) return;
    await request(`${BASE}/${id}`, { method: "POST", json: fields });
    await this.refresh();
  }

  async open(id) {
    const conversation = await getJson(`${BASE}/${id}`);
    this.currentId = id;
    this.render(this.items);
    this.onOpen(conversation);
  }

  async rename(id, title) {
    await request(`${BASE}/${id}`, { method: "POST", json: { title } });
    await this.refresh();
  }

  async remove(id) {
    await request(`${BASE}/${id}`, { method: "DELETE" });
    if (id === this.currentId) {
      this.currentId = null;
      this.onOpen(null);
    }
    await this.refresh();
  }

  render(items) {
    const list = $("conversation-list");
    list.replaceChildren(...items.map((c) => this.row(c)));
  }

  row(c) {
    const li = el("li", { class: c.id === this.currentId ? "current" : "", "data-id": c.id, "data-count": c.message_count });
    const open = el("button", { class: "open", type: "button", title: c.title, onclick: () => this.open(c.id) }, c.title);
    const rename = el("button", { class: "icon", type: "button", "aria-label": `Rename ${c.title}`, title: "Rename",
                                  onclick: () => this.editTitle(li, c) }, "✎");
    const remove = el("button", { class: "icon", type: "button", "aria-label": `Delete ${c.title}`, title: "Delete",
                                  onclick: () => this.remove(c.id) }, "✕");
    li.append(open, rename, remove);
    return li;
  }

  // The title becomes an input: Enter keeps the new title, Escape the old one.
  editTitle(li, c) {
    const input = el("input", { type: "text", value: c.title, "aria-label": "New title", maxlength: "200" });
    li.replaceChildren(input);
    input.focus();
    input.select();
    input.addEventListener("keydown", async (event) => {
      if (event.key === "Escape") this.render(this.items);
      if (event.key === "Enter" && input.value.trim()) await this.rename(c.id, input.value.trim());
    });
    input.addEventListener("blur", () => this.render(this.items));
  }
}
