"""The page's words in English, Traditional Chinese (zh-TW) and Simplified Chinese (zh-CN).

One :class:`gradio.I18n` holds them, read from ``assets/i18n/<locale>.json`` (a flat
``{key: text}`` per locale; English is the fallback of every key). gradio translates the
page's static words in the browser (labels, buttons, tabs, tooltips, Markdown): a component
gets ``words(key)``, an ``I18nData`` marker, and gradio picks the locale from the browser's
language or from the page's language switch. gradio translates one marker per string and not
the values a handler computes, so the HTML the handlers write (counters, badges, the
explanation line, the start-up steps) is written here in the locale the page shows, which
every such handler receives as its ``lang`` input: the value of the page's language switch,
which follows the browser's language when the page opens (:data:`LOAD_LANG_JS`).

The same dictionaries hold sentence templates (keys ``s_*``): English wording that a lower
layer writes (a start-up step, a warning, a reason), with ``{name}`` placeholders, and its
translation; :func:`sentence` translates such a sentence by the template it matches and
leaves any other sentence as written.
"""

from __future__ import annotations

import functools
import json
import re

import gradio as gr

from .. import PROJECT_DIR

I18N_DIR = PROJECT_DIR / "assets" / "i18n"
#: the page's languages, in the switch's order: (locale, its name in its own script)
LANGUAGES = (("en", "English"), ("zh-TW", "繁體中文"), ("zh-CN", "简体中文"))
LOCALES = tuple(code for code, _ in LANGUAGES)
DEFAULT = "en"


@functools.lru_cache(maxsize=1)
def i18n() -> gr.I18n:
    """The page's :class:`gradio.I18n` (read once, on first use; nothing is read at import)."""
    return gr.I18n(**{code: json.loads((I18N_DIR / f"{code}.json").read_text(encoding="utf-8"))
                      for code in LOCALES})


def words(key: str):
    """A static word of the page, translated in the browser (``gr.I18n``'s marker)."""
    if key not in i18n().translations_dict[DEFAULT]:
        raise KeyError(f"no English text for {key!r} in {I18N_DIR / 'en.json'}")
    return i18n()(key)


def locale(code: str | None) -> str:
    """The page's locale for a browser's language tag: Traditional for zh-TW, zh-HK, zh-MO and
    zh-Hant*, Simplified for the other Chinese tags, else English."""
    code = (code or "").strip().replace("_", "-")
    lower = code.lower()
    if lower in ("zh-tw", "zh-hk", "zh-mo") or lower.startswith("zh-hant"):
        return "zh-TW"
    if lower == "zh" or lower.startswith("zh-"):
        return "zh-CN"
    return code if code in LOCALES else DEFAULT


def t(key: str, lang: str | None = DEFAULT, **values) -> str:
    """The text of ``key`` in ``lang`` (English where that locale lacks it), with ``values``
    filled in (``str.format``).

    Raises:
        KeyError: no English text for ``key``.
    """
    table = i18n().translations_dict
    text = table.get(locale(lang), {}).get(key)
    if text is None:
        text = table[DEFAULT][key]
    return text.format(**values) if values else text


#: placeholders of a sentence template that stand for one word ("plain", "43%", "ngram")
ONE_WORD = {"lane", "share", "n", "accepted", "drafted", "source", "backend", "drafter", "name",
            "best", "ms", "forward", "acc", "k", "x", "cores", "prior", "widths", "probe", "env",
            "tok", "size"}
#: placeholders of a sentence template that stand for a number ("555", "1.2")
NUMBER = {"num"}


@functools.lru_cache(maxsize=1)
def _templates() -> list[tuple[str, re.Pattern]]:
    """(key, pattern of its English text) per sentence template (keys ``s_*``), longest first."""
    out = []
    for key, text in i18n().translations_dict[DEFAULT].items():
        if not key.startswith("s_"):
            continue
        pattern, pos = "", 0
        for m in re.finditer(r"\{(\w+)\}", text):
            value = (r"-?\d[\d.,]*" if m.group(1) in NUMBER
                     else r"\S+?" if m.group(1) in ONE_WORD else ".+?")
            pattern += re.escape(text[pos:m.start()]) + f"(?P<{m.group(1)}>{value})"
            pos = m.end()
        out.append((key, re.compile(pattern + re.escape(text[pos:]) + r"\Z", re.S)))
    return sorted(out, key=lambda kp: -len(kp[1].pattern))


def sentence(text: str | None, lang: str | None) -> str:
    """``text`` (a sentence a lower layer wrote in English) in ``lang``: by the first template
    it matches, each placeholder's value translated in turn (a value can be a sentence too);
    text that matches none is returned as written."""
    if not text or locale(lang) == DEFAULT:
        return text or ""
    found = _match(text)
    if found is None:
        parts = _clauses(text)
        return "；".join(sentence(p, lang) for p in parts) if len(parts) > 1 else text
    key, values = found
    return t(key, lang, **{name: sentence(v, lang) for name, v in values.items()})


def _clauses(text: str) -> list[str]:
    """``text`` split at each "; " outside parentheses (a clause in brackets stays whole)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth = max(0, depth + {"(": 1, ")": -1}.get(ch, 0))  # a stray ")" closes nothing
        if depth == 0 and text.startswith("; ", i):
            parts.append(text[start:i])
            start = i + 2
    return parts + [text[start:]]


def _match(text: str) -> tuple[str, dict] | None:
    for key, pattern in _templates():
        m = pattern.match(text)
        if m:
            return key, m.groupdict()
    return None


#: put in the page's <head>: ``specdemoLocale(code)`` switches gradio's locale (its own
#: ``changeLocale``, the one its Settings panel calls) and returns the page's locale
HEAD = """<script>
window.specdemoLocale = async (code) => {
  const url = performance.getEntriesByType('resource').map(e => e.name)
    .find(n => /\\/assets\\/core-[\\w-]+\\.js$/.test(n));
  if (url) {
    try { const m = await import(url); if (m.changeLocale) m.changeLocale(code); }
    catch (e) { console.warn('specdemo: cannot switch the language', e); }
  }
  return code;
};
window.specdemoPageLocale = () => {
  const tag = (navigator.language || 'en').toLowerCase();
  if (['zh-tw', 'zh-hk', 'zh-mo'].includes(tag) || tag.startsWith('zh-hant')) return 'zh-TW';
  if (tag === 'zh' || tag.startsWith('zh-')) return 'zh-CN';
  return 'en';
};
</script>"""

#: the switch's first value, from the browser's language (an ``on load`` event's ``js``); gradio
#: maps zh-HK or zh-Hant to English, so the page switches to the locale :func:`locale` names
LOAD_LANG_JS = """async () => {
  const code = window.specdemoPageLocale ? window.specdemoPageLocale() : 'en';
  if (code !== (document.documentElement.lang || 'en') && window.specdemoLocale)
    await window.specdemoLocale(code);
  return code;
}"""

#: the switch changed (its value the first of the handler's inputs): gradio's locale follows,
#: then the handler draws what it wrote again
SWITCH_JS = ("async (code, ...rest) => "
             "[window.specdemoLocale ? await window.specdemoLocale(code) : code, ...rest]")
