"""Issue 53: the page in Traditional and Simplified Chinese (gradio's I18n), its computed lines in
the page's language, the article's terms, and what a new user met (a speedup from noise, the two
panes' histories after Stop). No browser here: tests/test_browser.py opens the page in one."""

import json
import re
import string

import pytest

from specdemo.core.machine import busy_warning
from specdemo.core.stats import DecodeStats
from specdemo.interfaces import ui_i18n
from specdemo.interfaces.ui_format import counters_html, startup_html, verdict_html
from specdemo.interfaces.ui_i18n import I18N_DIR, LOCALES, locale, sentence, t
from specdemo.services import startup
from specdemo.services.pipeline import low_acceptance_warnings
from specdemo.services.race import DONE, PLAIN, SKIPPED, SPECULATIVE, STOPPED, PaneView, RaceSnapshot
from specdemo.services.startup import DoneStep, StepView

TABLES = {code: json.loads((I18N_DIR / f"{code}.json").read_text(encoding="utf-8")) for code in LOCALES}
ARTICLE = {"zh-TW": ("推測解碼", "草稿模型", "目標模型", "接受率", "平均接受長度", "首字延遲"),
           "zh-CN": ("推测解码", "草稿模型", "目标模型", "接受率", "平均接受长度", "首字延迟")}
# characters written differently in the two scripts: none of the first in Simplified text
TRADITIONAL_ONLY = "測碼語載體與這個們時為過說後會從開關應選擇檢請輸預設記憶顯數據"
SIMPLIFIED_ONLY = "测码语载体与这个们时为过说后会从开关应选择检请输预设记忆显数据"


def fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def test_every_word_exists_in_every_language_with_the_same_placeholders():
    assert set(TABLES["zh-TW"]) == set(TABLES["en"]) == set(TABLES["zh-CN"])
    for key, text in TABLES["en"].items():
        for code in ("zh-TW", "zh-CN"):
            assert fields(TABLES[code][key]) == fields(text), (code, key)


def test_the_chinese_pages_use_the_articles_terms_in_their_own_script():
    for code, terms in ARTICLE.items():
        everything = " ".join(TABLES[code].values())
        assert all(term in everything for term in terms), (code, [x for x in terms if x not in everything])
    simplified = " ".join(TABLES["zh-CN"].values())
    traditional = " ".join(TABLES["zh-TW"].values())
    assert not set(TRADITIONAL_ONLY) & set(simplified), set(TRADITIONAL_ONLY) & set(simplified)
    assert not set(SIMPLIFIED_ONLY) & set(traditional), set(SIMPLIFIED_ONLY) & set(traditional)
    assert t("m_ttft_s", "zh-TW") == "首字延遲" and t("m_mean_acceptance_length", "zh-CN") == "平均接受长度"
    assert t("send", "zh-TW") == "送出" and t("send", "zh-CN") == "发送" and t("send", "en") == "Send"


@pytest.mark.parametrize("tag, page", [("zh-TW", "zh-TW"), ("zh-HK", "zh-TW"), ("zh-Hant-TW", "zh-TW"),
                                       ("zh-CN", "zh-CN"), ("zh", "zh-CN"), ("zh-SG", "zh-CN"),
                                       ("en-US", "en"), ("fr", "en"), (None, "en")])
def test_a_browser_language_gets_its_page(tag, page):
    assert locale(tag) == page


def test_the_start_up_steps_and_warnings_are_translated_by_their_templates():
    """The sentences the lower layers write, as they write them today: each is matched by a
    template (a changed wording there fails here, not silently on the page)."""
    stats = DecodeStats(drafted_by={"eagle3": 40}, accepted_by={"eagle3": 1})
    written = [
        "loading builtin:smollm2-135m", "warming up builtin:smollm2-135m",
        "warming up builtin:smollm2-135m with draft ngram",
        "locating and converting builtin:smollm2-135m's weights (once; not converted yet)",
        startup.tokenizer_step("builtin:smollm2-135m", "builtin:gemma3-270m")[1],
        startup.check_step("builtin:smollm2-135m", "ngram")[1],
        "importing torch and transformers (once per start)",
        "compiling our C forward for this CPU (once per machine)",
        "measuring what a forward over n tokens costs builtin:smollm2-135m here (once per start, "
        "for draft length auto)",
        busy_warning({"plain": 0.43}), busy_warning({"plain": 0.43, "speculative": 0.5}),
        *low_acceptance_warnings(stats),
        "the plain run was stopped", "the speculative run did not finish"]
    for text in written:
        for code in ("zh-TW", "zh-CN"):
            shown = sentence(text, code)
            assert shown != text and len(re.findall(r"[\u4e00-\u9fff]", shown)) >= 4, (code, text, shown)
    assert sentence(busy_warning({"plain": 0.43, "speculative": 0.5}), "zh-TW") == (
        "機器忙碌：其他行程占用了一般解碼期間 43% 的 CPU，以及推測解碼期間的 50%；這個加速比不可靠")
    assert sentence("a sentence no template knows", "zh-TW") == "a sentence no template knows"
    assert sentence("loading builtin:smollm2-135m", "en") == "loading builtin:smollm2-135m"


def test_counters_start_up_and_badge_are_written_in_the_pages_language():
    s = DecodeStats(new_tokens=12, ttft_s=0.25, elapsed_s=1.0)
    s.record_round(4, 3)
    view = PaneView(SPECULATIVE, DONE, None, "", (), (), s, 1, ())
    shown = counters_html(view, True, 4, lang="zh-TW")
    labels = re.findall(r'class="sd-label">([^<]*)<', shown)
    assert labels[:5] == ["Token 數", "每秒 Token 數", "首字延遲", "耗時", "接受率"]
    assert "0.25 秒" in shown and 'data-metric="ttft_s"' in shown  # the key stays for scripts
    assert "首字延迟" in counters_html(view, True, 4, lang="zh-CN")
    assert "Time to first token" in counters_html(view, True, 4)
    step = StepView("loading builtin:smollm2-135m", 2.0, 3.0)
    panel = startup_html(step, [DoneStep("importing torch and transformers (once per start)", 4.0)],
                         ready=False, lang="zh-TW")
    assert "正在載入 builtin:smollm2-135m" in panel and "2 秒／預計約 3 秒" in panel
    assert 'data-step="loading builtin:smollm2-135m"' in panel  # the English name for scripts
    assert "送出提示詞" in verdict_html(None, 0, "zh-TW")


def race(speedup: float, accepted_per_round: int, rounds: int = 10, stopped: bool = False):
    """A finished greedy race whose speculative lane accepted ``accepted_per_round`` a round."""
    plain = DecodeStats(new_tokens=rounds * (accepted_per_round + 1), elapsed_s=1.0)
    spec = DecodeStats(new_tokens=plain.new_tokens, elapsed_s=1.0 / speedup)
    for _ in range(rounds):
        spec.record_round(4 if accepted_per_round else 0, accepted_per_round)
    ids = tuple(range(plain.new_tokens))
    views = {PLAIN: PaneView(PLAIN, STOPPED if stopped else DONE, None, "x", ids, (), plain, 1, ()),
             SPECULATIVE: PaneView(SPECULATIVE, DONE, None, "x", ids, (), spec, 1, ())}
    return RaceSnapshot(views, "done", None, speedup, None, True)


def test_a_speedup_from_noise_does_not_read_as_a_win():
    """Issue 53: a tree race with ngram read "Speedup 1.70x (speculative faster)" while it drafted
    almost nothing. Each target forward gave ~1 token there, so drafting explains at most that."""
    noise = race(1.70, 0)
    assert noise.panes[SPECULATIVE].stats.drafted == 0  # each forward one token
    chip = verdict_html(noise, 0.0)
    assert 'data-noise="true"' in chip and "faster" not in chip
    assert "not from drafting" in chip and "at most 1.00×" in chip
    assert "雜訊" in verdict_html(noise, 0.0, "zh-TW")
    won = verdict_html(race(1.30, 2), 0.0)  # 3 tokens a forward: 1.30x is drafting's
    assert "speculative faster" in won and "data-noise" not in won
    lost = verdict_html(race(0.8, 0), 0.0)
    assert "speculative slower" in lost and "data-noise" not in lost


def turn(status: str, text: str) -> dict:
    return {"user": "count", "text": text, "tokens": [], "status": status, "error": None}


def test_after_stop_then_send_both_panes_continue_the_same_conversation():
    """Issue 53: Stop during the plain lane kept its 126 tokens, the speculative lane never ran;
    the next Send gave the plain lane that turn and the speculative lane none."""
    from specdemo.interfaces.ui_race import histories, histories_differ
    conv = {PLAIN: [turn(STOPPED, "1, 2, 3")], SPECULATIVE: [turn(SKIPPED, "")]}
    assert histories(conv) == {PLAIN: [], SPECULATIVE: []}
    assert not histories_differ(conv)
    conv = {name: turns + [turn(DONE, "one two")] for name, turns in conv.items()}
    both = histories(conv)
    assert both[PLAIN] == both[SPECULATIVE] == [{"role": "user", "content": "count"},
                                               {"role": "assistant", "content": "one two"}]
    # sampled answers differ: the lanes then continue different conversations, and the badge says
    # so instead of blaming floating point
    conv[SPECULATIVE][-1] = turn(DONE, "one three")
    assert histories_differ(conv)
    snap = race(1.0, 1)
    diverged = RaceSnapshot(snap.panes, "done", None, 1.0, 0, False)
    assert "different conversations" in verdict_html(diverged, 0.0, histories_differ=True)
    assert "floating point" in verdict_html(diverged, 0.0)


def test_the_page_takes_gradios_i18n_and_every_static_word_has_english():
    from specdemo.interfaces import ui
    options = ui.launch_options()
    assert options["i18n"] is ui_i18n.i18n() and "specdemoLocale" in options["head"]
    with pytest.raises(KeyError):
        ui_i18n.words("no such word")


def test_every_preset_note_exists_in_both_scripts():
    """The preset's line under the dropdown: each presets/*.toml has its note in Traditional and
    Simplified Chinese, each in its own script; a page in English keeps the English note."""
    from specdemo.services.presets import list_presets
    for p in list_presets():
        assert len(re.findall(r"[\u4e00-\u9fff]", p.note_zh_tw)) >= 8, p.name
        assert len(re.findall(r"[\u4e00-\u9fff]", p.note_zh_cn)) >= 8, p.name
        assert not set(SIMPLIFIED_ONLY) & set(p.note_zh_tw), (p.name, set(SIMPLIFIED_ONLY) & set(p.note_zh_tw))
        assert not set(TRADITIONAL_ONLY) & set(p.note_zh_cn), (p.name, set(TRADITIONAL_ONLY) & set(p.note_zh_cn))
        assert (p.note_in("zh-TW"), p.note_in("zh-CN"), p.note_in("en")) == (p.note_zh_tw, p.note_zh_cn, p.note)


def test_the_machine_fit_line_is_translated_by_its_templates():
    """What hardware.fits writes (fits, too small, would fit instead, nothing smaller), as it
    writes it, in both scripts with the figures and the device kept."""
    from specdemo.models import hardware
    from specdemo.services.presets import list_presets
    presets = list(list_presets())
    small = next(p for p in presets if p.name == "smollm2-135m-ngram")
    big = next(p for p in presets if p.name == "qwen2.5-7b-0.5b")
    roomy = hardware.HardwareInfo("cpu", "AMD EPYC", 32 * 2**30, 18 * 2**30, 2, 32 * 2**30, 18 * 2**30)
    tight = hardware.HardwareInfo("cpu", "AMD EPYC", 32 * 2**30, 3 * 2**30, 2, 32 * 2**30, 3 * 2**30)
    ok, fits = hardware.fits(small, roomy)
    assert ok and sentence(fits, "zh-TW") == fits.replace("needs ", "需要 ").replace(
        " of ", "，AMD EPYC 上可用 ").replace(" free on AMD EPYC", "")
    tiny = hardware.HardwareInfo("cpu", "AMD EPYC", 32 * 2**30, 2**30, 2, 32 * 2**30, 2**30)
    reasons = [hardware.fits(small, tiny, presets)[1], hardware.fits(small, tiny)[1],
               hardware.fits(big, tight, presets)[1]]
    assert reasons[0].endswith(" is free on AMD EPYC; nothing smaller fits")
    assert reasons[1].startswith("needs ") and reasons[1].endswith(" is free on AMD EPYC")
    assert reasons[2].startswith("made for cuda/mps; this machine runs on cpu; would fit: ")
    for code in ("zh-TW", "zh-CN"):
        for reason in reasons:
            shown = sentence(reason, code)
            assert not re.search(r"needs|free|would fit|nothing|smaller|made for|runs on", shown), shown
            assert all(figure in shown for figure in re.findall(r"\d+\.\d GB", reason)), shown
    assert sentence(reasons[2], "zh-TW").startswith("為 cuda/mps 設計；這台機器使用 cpu；可改用：較小的預設組合：")


def test_the_engine_choices_and_the_race_legend_are_translated():
    import gradio as gr
    from specdemo.interfaces import ui, ui_engines
    from specdemo.interfaces.ui_format import race_frame
    from specdemo.interfaces.ui_race import ENGINE_CHOICES
    with gr.Blocks():
        engines = ui_engines.engines_controls()[0]
    assert [(label.key, value) for label, value in engines.choices] == [
        ("engine_ours", ENGINE_CHOICES[0]), ("engine_servers", ENGINE_CHOICES[1])]
    assert t("engine_servers", "zh-TW") == "伺服器（相容 OpenAI 的端點）"
    assert race_frame(None, "zh-TW")["lane"].tolist() == ["一般", "推測"]
    assert race_frame(None, "zh-CN")["lane"].tolist() == ["一般", "推测"]
    titles = ui._race_titles("zh-TW")
    assert titles["color_title"] == "路線" and titles["color_map"] == {"一般": "#6b7280", "推測": "#16a34a"}
    assert ui._race_titles("en")["color_map"] == {"plain": "#6b7280", "speculative": "#16a34a"}


CJK = r"[\u4e00-\u9fff]"
#: a Chinese character touching a Latin letter or a digit: the pages put a space between them
#: ("每秒 Token 數"), so a template that glues a placeholder to its neighbour shows here
GLUED = re.compile(rf"{CJK}[A-Za-z0-9]|[A-Za-z0-9]{CJK}")


def _english_left(shown: str) -> list[str]:
    """Runs of three or more English words in ``shown`` (names, numbers and units aside)."""
    return re.findall(r"[A-Za-z]{2,}(?:[ '][A-Za-z]{2,}){2,}", shown)


def test_the_threads_line_is_in_the_pages_language():
    """A new user's zh-TW page read "執行緒：OpenMP threads spin while they wait (0 other runnable
    task(s) at start, 2 cores)": the line's middle is ``_omp.describe``'s English."""
    from specdemo import _omp
    from specdemo.interfaces import ui_state
    decisions = [{"policy": "spin", "others_running": 0, "cores": 2},
                 {"policy": "passive", "others_running": 3, "cores": 2},
                 {"policy": "spin", "others_running": None, "cores": 2},
                 {"policy": "user", "setting": {"OMP_WAIT_POLICY": "ACTIVE"}}]
    for decision in decisions:
        for code in ("zh-TW", "zh-CN"):
            shown = sentence(_omp.describe(decision), code)
            assert not _english_left(shown) and not GLUED.search(shown), (code, shown)
    import specdemo
    specdemo_wait = specdemo.OMP_WAIT
    try:
        specdemo.OMP_WAIT = decisions[0]
        assert ui_state.threads_note("zh-TW") == "執行緒：OpenMP 執行緒在等待時持續空轉（啟動時有 0 個其他可執行的工作，2 個核心）。"
        assert ui_state.threads_note("en") == "Threads: OpenMP threads spin while they wait (0 other runnable task(s) at start, 2 cores)."
    finally:
        specdemo.OMP_WAIT = specdemo_wait


def _backend_notes() -> list[str]:
    """The backend choice's start-up notes as ``services.backend_choice`` writes them today."""
    from types import SimpleNamespace
    from specdemo.services import backend_choice as gb
    from specdemo.services import backend_rules as bc
    forward = {n: 0.001 * n for n in bc.RACE_WIDTHS}
    choice = gb.BackendChoice("native-w8a8", "", {"native-w8a8": 0.0069, "native": 0.0133},
                              forward_s={"native-w8a8": forward, "native": forward},
                              draft_length={"native-w8a8": 4, "native": 0},
                              acceptance={"native-w8a8": 0.37})
    lanes = [bc.RaceLane("builtin:smollm2-135m-eagle3", (1, 2), source=object()),
             bc.RaceLane("ngram"), bc.RaceLane("none")]
    notes = []
    for lane in lanes:
        reason = ("measured: " + gb._weighed(choice, lane)
                  + "; ruled out by a 5-token probe: transformers (its first forward took 528 ms, "
                    "over 10x the best probe); ggml (its probe took 26 ms, 4.8x native-w8a8's)"
                  + f"; machine busy: others used 60% of the CPU ({gb.RECALIBRATE} on a quiet machine)")
        notes.append(f"forward backend of builtin:smollm2-135m: native-w8a8 ({reason})")
    notes.append(f"forward backend of t: native (measured earlier on this machine ({gb.RECALIBRATE}): "
                 + gb._weighed(choice, lanes[2]) + ")")
    notes.append("choosing the forward backend for builtin:smollm2-135m (auto, weighed for draft ngram)")
    notes.append("choosing the forward backend for builtin:smollm2-135m (auto, weighed as a race's plain lane)")
    with_gpu = gb.with_backend(SimpleNamespace(device=SimpleNamespace(type="cuda")), "auto")
    notes.append(f"forward backend of t: transformers ({with_gpu[1].reason})")
    return notes


def test_the_backend_notes_of_the_start_up_are_in_the_pages_language(monkeypatch):
    """The start-up panel's "forward backend of ...: native-w8a8 (measured: weighed for a race
    with ...)" stayed English on the Chinese pages (its reason had no template)."""
    from specdemo.models import backends as mb
    monkeypatch.setattr(mb, "replace_backend", lambda loaded, name: loaded)
    for note in _backend_notes():
        for code in ("zh-TW", "zh-CN"):
            shown = sentence(note, code)
            assert not _english_left(shown) and not GLUED.search(shown), (code, note, shown)
    assert sentence(_backend_notes()[0], "zh-TW").startswith(
        "builtin:smollm2-135m 的前向計算後端：native-w8a8（實測：為賽跑權衡，推測路線用草稿模型 "
        "builtin:smollm2-135m-eagle3：")


def test_a_clause_in_brackets_is_not_split_at_its_semicolon():
    assert ui_i18n._clauses("a (b; c); d") == ["a (b; c)", "d"]
    assert ui_i18n._clauses("no clauses") == ["no clauses"]


def test_the_why_line_puts_a_space_between_chinese_and_token():
    """The zh why-line read "驗證平均每輪 4.0 個草稿 Token花費": the pages space Latin words
    from Chinese ("每秒 Token 數")."""
    from specdemo.core.stats import DecodeStats, explain
    from specdemo.interfaces.ui_format import explanation_text
    plain = DecodeStats(new_tokens=21, prompt_tokens=4, verify_s=0.10, target_forwards=10)
    spec = DecodeStats(new_tokens=21, prompt_tokens=4, verify_s=0.1, target_forwards=10,
                       draft_s=0.001, draft_length_sum=20, drafted=20, drafter="ngram")
    e = explain(plain, spec)
    for code in ("zh-TW", "zh-CN"):
        line = explanation_text(e, lang=code)
        assert "Token 花" in line and not GLUED.search(line), (code, line)


def test_no_chinese_template_glues_a_latin_placeholder_to_a_chinese_character():
    """Every zh text, its placeholders filled with a Latin word: no Chinese character touches it,
    except where the value is itself Chinese (a lane's word, a translated clause)."""
    chinese_values = {"lane", "who", "parts", "first", "what", "drafts", "time", "estimate", "extra", "recal",
                      "then", "now"}
    for code in ("zh-TW", "zh-CN"):
        for key, text in TABLES[code].items():
            filled = text.format(**{n: ("一般" if n in chinese_values else "Latin")
                                    for n in fields(text)})
            assert not GLUED.search(filled), (code, key, filled)


def test_a_refused_drafts_tokenizer_reason_is_in_the_pages_language():
    """The zh drafts list read "不適用：✗ builtin:gemma3-270m: different tokenizers: target BPE
    tokenizer of 'builtin:smollm2-135m' with 49,152 tokens, ..." (``checks/compat``'s English)."""
    from types import SimpleNamespace
    from specdemo.checks import compat

    class BPE:
        pass

    def vocab(label, words):
        tok = SimpleNamespace(backend_tokenizer=SimpleNamespace(model=BPE()), name_or_path="",
                              get_vocab=lambda: {w: i for i, w in enumerate(words)})
        return compat._vocab(tok, label)
    problems, _ = compat._compare_vocab(vocab("builtin:smollm2-135m", ["a", "b", "c"]),
                                        vocab("builtin:gemma3-270m", ["a", "x", "y", "z"]))
    assert problems[0].startswith("different tokenizers: target BPE tokenizer of")
    assert sentence(problems[0], "zh-TW") == (
        "分詞器不同：目標模型用 'builtin:smollm2-135m' 的 BPE 分詞器（3 個 Token），"
        "草稿模型用 'builtin:gemma3-270m' 的 BPE 分詞器（4 個 Token）")
    assert not _english_left(sentence(problems[0], "zh-CN"))


def test_why_the_backend_is_measured_again_is_in_the_pages_language(monkeypatch, tmp_path):
    """The start-up step says why ``auto`` measures (``backend_store.miss_reason``: a first
    choice, a stored choice keyed otherwise, one a recheck dropped); each clause has its
    template, so the Chinese pages show no English run of words."""
    import json
    from specdemo.services import backend_choice as gb
    from specdemo.services import backend_store as store
    path = tmp_path / "backend-choice.json"
    monkeypatch.setattr(store, "choice_path", lambda: path)
    here = store.machine_fingerprint()
    parts = {"target": "builtin:smollm2-135m", "omp": "automatic"}
    clauses = [store.miss_reason("k", parts)]  # nothing stored yet
    path.write_text(json.dumps({"old": {"machine": here, "backend": "native",
                                        "key_parts": dict(parts, omp="OMP_WAIT_POLICY=active")}}))
    clauses.append(store.miss_reason("k", parts))
    path.write_text(json.dumps({"k": {"machine": here, store.DROPPED:
                                      "a run measured a one-token forward of 5.6 ms on native, "
                                      "0.51x the 11.0 ms it expected"}}))
    clauses.append(store.miss_reason("k", parts))
    assert [c.split(":")[0] for c in clauses] == ["first choice here", "measured again",
                                                   "measured again"]
    policy = gb._POLICY_WORDS
    clauses.append(f"forward backend of t: native (measured earlier on this machine "
                   f"({gb.RECALIBRATE}; OpenMP threads {policy['spin']} then, {policy['passive']} "
                   "now, as chosen from the load at start; a run far from its estimate drops "
                   "it): weighed for a plain decode)")
    for clause in clauses:
        note = ("choosing the forward backend for builtin:smollm2-135m (auto, weighed as a "
                f"race's plain lane; {clause})")
        for code in ("zh-TW", "zh-CN"):
            shown = sentence(note, code)
            left = [w for w in _english_left(shown) if "OMP_WAIT_POLICY" not in w]
            assert not left and not GLUED.search(shown), (code, note, shown)


def test_what_the_target_runs_on_is_in_the_pages_language():
    """The zh model line read "執行於 native-w8a8: int8 weights and int8 activations in our C
    forward, loaded from float32": each backend's words (``core.TARGET_BACKENDS``) and the
    line's structure have templates."""
    from types import SimpleNamespace
    from specdemo.core import TARGET_BACKENDS
    from specdemo.interfaces.ui_state import runs_on
    targets = [SimpleNamespace(dtype="torch.float32", backend=name, quantization=None)
               for name in TARGET_BACKENDS if name != "transformers"]
    targets += [SimpleNamespace(dtype="torch.float32", backend="a-future-one", quantization=None),
                SimpleNamespace(dtype="torch.float32", backend="transformers", quantization="int8")]
    for target in targets:
        written = runs_on(target)
        for code in ("zh-TW", "zh-CN"):
            shown = t("runs_on", code, runs=sentence(written, code))
            assert shown != written and not _english_left(shown) and not GLUED.search(shown), (
                code, written, shown)
    w8a8 = runs_on(SimpleNamespace(dtype="torch.float32", backend="native-w8a8", quantization=None))
    assert sentence(w8a8, "zh-TW") == "native-w8a8：本專案 C 前向計算中的 int8 權重和 int8 激活值，載入時為 float32"


def test_why_a_backend_is_not_available_is_in_the_pages_language(monkeypatch):
    """The zh backend step read "ggml 無法使用：llama.cpp's shared library was not found
    (scripts/setup.sh engines builds it)": the reasons ``models`` writes have templates, in
    their whole and short (``backend_choice._short``) forms."""
    from types import SimpleNamespace
    from specdemo.models import compiled_backend as cb
    from specdemo.models import ggml_backend as gg
    from specdemo.models import llama_ctypes
    from specdemo.services import backend_choice as gb
    monkeypatch.setattr(llama_ctypes, "_LIB", None)
    monkeypatch.setattr(llama_ctypes, "_ERROR", None)
    monkeypatch.setattr(llama_ctypes, "library_dir", lambda: None)
    with pytest.raises(OSError) as missing:
        llama_ctypes.library()
    cpu, gpu = SimpleNamespace(type="cpu"), SimpleNamespace(type="cuda")
    reasons = [str(missing.value), "not on the CPU",  # models.backends' own words
               gg.unavailable_reason(SimpleNamespace(device=gpu, quantization=None, spec="t")),
               gg.unavailable_reason(SimpleNamespace(device=cpu, quantization="int4", spec="t")),
               cb.unavailable_reason(SimpleNamespace(quantization="int4", model=None)),
               gg._no_gguf("builtin:smollm2-135m")]
    import torch
    from specdemo.models import cuda_graph_backend as cg
    from specdemo.models.native import attach

    def model(dtype=torch.float32, device=cpu, **config):
        weight = SimpleNamespace(dtype=dtype, device=device)
        return SimpleNamespace(config=SimpleNamespace(**{"model_type": "llama", **config}),
                               parameters=lambda: iter([weight]))
    for name in ("int8", "native"):
        reasons += [cb.llama_reason(model(model_type="gemma3"), name),
                    cb.llama_reason(model(attention_bias=True), name),
                    cb.llama_reason(model(hidden_act="gelu"), name),
                    cb.llama_reason(model(sliding_window=512), name),
                    cb.llama_reason(model(device=gpu), name)]
    reasons += [cb.unsupported_reason(model(torch.bfloat16)),
                attach.unavailable_reason(SimpleNamespace(quantization="int4")),
                cg.unavailable_reason(SimpleNamespace(quantization="int4"))]
    assert all(reasons), reasons
    for reason in reasons:
        for name in ("ggml", "int8"):
            for why in {f"{name} not available: {reason}", gb._short(f"{name} not available: {reason}")}:
                for code in ("zh-TW", "zh-CN"):
                    shown = sentence(why, code)
                    left = [w for w in _english_left(shown) if not w.startswith("pip install")]
                    assert not left and not GLUED.search(shown), (code, why, shown)
    assert sentence(gb._short(f"ggml not available: {missing.value}"), "zh-TW") == (
        "ggml 無法使用：找不到 llama.cpp 的共享函式庫（用 scripts/setup.sh engines 建置）")


def test_a_duration_inside_a_sentence_reads_in_the_pages_unit():
    """The zh page read "花了 555 ms" where it writes 毫秒 elsewhere: a value "{n} ms" (or "{n} s",
    ``services.backend_rules``' durations) is translated by its template."""
    from specdemo.services import backend_rules as bc
    took, long = bc._ms(0.555), bc._ms(1.5)
    assert took == "555 ms"
    for code in ("zh-TW", "zh-CN"):
        assert sentence(took, code) == "555 毫秒" and sentence(long, code) == "1.5 秒"
    assert sentence("555 ms", "en") == "555 ms"
    assert sentence("a few ms", "zh-TW") == "a few ms"  # only a number is a duration


@pytest.mark.parametrize("code", ["zh-TW", "zh-CN"])
def test_a_panes_finish_reason_is_in_the_pages_language(code):
    """The zh pane read "完成（length）": every finish reason the engine writes has its words."""
    import inspect
    from specdemo.core import engine
    from specdemo.interfaces.ui_format import FINISH_REASONS, status_line
    written = set(re.findall(r'finish_reason = "(\w+)"', inspect.getsource(engine)))
    assert written and written <= set(FINISH_REASONS), written
    for reason in FINISH_REASONS:
        s = DecodeStats(new_tokens=3, elapsed_s=1.0)
        s.finish_reason = reason
        view = PaneView(PLAIN, DONE, None, "x", (), (), s, 1, ())
        shown = status_line(view, lang=code)
        assert not re.search(r"[A-Za-z]{3,}", shown.replace("Token", "")), (reason, shown)
        assert status_line(view) == f"done ({reason})"  # English as before
    s.finish_reason = "tool_calls"  # an endpoint's own reason, as written
    assert "tool_calls" in status_line(PaneView(PLAIN, DONE, None, "x", (), (), s, 1, ()), lang=code)


def test_a_speedup_that_rounds_to_one_says_neither_faster_nor_slower():
    """The badge read "Speedup 1.00× (speculative slower, in tokens/s)" for 102.3 against
    102.1 tokens/s: a figure that reads 1.00× says the same speed, in every language."""
    for speedup in (102.1 / 102.3, 1.004):
        chip = verdict_html(race(speedup, 2), 0.0)
        assert "1.00×" in chip and "slower" not in chip and "faster" not in chip, chip
        assert t("speedup_same", "en", x="1.00") in chip
        for code in ("zh-TW", "zh-CN"):
            shown = verdict_html(race(speedup, 2), 0.0, code)
            assert t("speedup_same", code, x="1.00") in shown
            assert t("speedup_faster", code, x="1.00") not in shown
            assert t("speedup_slower", code, x="1.00") not in shown
    assert "speculative faster" in verdict_html(race(1.01, 2), 0.0)
    assert "speculative slower" in verdict_html(race(0.99, 2), 0.0)
