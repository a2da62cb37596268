"""The usage chart: tokens per day as stacked bars, an inline SVG drawn on the server.

Only numbers and escaped labels go into it; it needs no script and no style
attribute (colours are presentation attributes, which the CSP allows).
"""

from __future__ import annotations

from html import escape

from markupsafe import Markup

from chatstate.ops.usage import Row

WIDTH, HEIGHT, PAD, AXIS = 760, 240, 8, 40
PROMPT, COMPLETION = "#5b8def", "#f29f4c"


def bars(rows: list[Row]) -> Markup:
    """Prompt and completion tokens of each row (a day), oldest first."""
    if not rows:
        return Markup('<p class="empty">No usage recorded yet.</p>')
    top = max(r.prompt_tokens + r.completion_tokens for r in rows) or 1
    inner_h = HEIGHT - AXIS - PAD
    step = (WIDTH - AXIS - PAD) / len(rows)
    width = max(1.0, step * 0.8)
    out = [f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
           f'height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg" '
           'aria-label="tokens per day">',
           f'<line x1="{AXIS}" y1="{PAD + inner_h}" x2="{WIDTH - PAD}" y2="{PAD + inner_h}" '
           'stroke="#888"/>',
           f'<text x="{AXIS - 4}" y="{PAD + 10}" text-anchor="end" font-size="10">'
           f'{top:,}</text>',
           f'<text x="{AXIS - 4}" y="{PAD + inner_h}" text-anchor="end" font-size="10">0'
           '</text>']
    label_every = max(1, len(rows) // 12)
    for i, row in enumerate(rows):
        x = AXIS + i * step + (step - width) / 2
        p_h = inner_h * row.prompt_tokens / top
        c_h = inner_h * row.completion_tokens / top
        key = escape(row.key)
        tip = escape(f"{row.key}: {row.prompt_tokens:,} prompt + {row.completion_tokens:,} "
                     f"completion tokens, {row.replies} replies")
        out.append(f'<g class="bar" data-day="{key}"><title>{tip}</title>'
                   f'<rect x="{x:.1f}" y="{PAD + inner_h - p_h:.1f}" width="{width:.1f}" '
                   f'height="{p_h:.1f}" fill="{PROMPT}"/>'
                   f'<rect x="{x:.1f}" y="{PAD + inner_h - p_h - c_h:.1f}" '
                   f'width="{width:.1f}" height="{c_h:.1f}" fill="{COMPLETION}"/></g>')
        if i % label_every == 0:
            out.append(f'<text x="{x + width / 2:.1f}" y="{HEIGHT - AXIS + 16}" '
                       f'text-anchor="middle" font-size="10">{key[5:]}</text>')
    out.append(f'<g font-size="11"><rect x="{AXIS}" y="{HEIGHT - 14}" width="10" height="10" '
               f'fill="{PROMPT}"/><text x="{AXIS + 14}" y="{HEIGHT - 5}">prompt</text>'
               f'<rect x="{AXIS + 70}" y="{HEIGHT - 14}" width="10" height="10" '
               f'fill="{COMPLETION}"/><text x="{AXIS + 84}" y="{HEIGHT - 5}">completion'
               '</text></g></svg>')
    return Markup("".join(out))
