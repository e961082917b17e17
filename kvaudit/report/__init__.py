"""Stage 6, the reports: an audit as JSON and rich tables (``render``), the start-up lines the emulated release
would log (``startup``), tables that fit any width (``tables``), pages (``page``: HTML, SVG), and two saved
reports compared (``compare``), and a live server's audit (``live``). The records they render are kvaudit's
shared ``results``.

Imports the stages below it; nothing here runs an audit."""

__all__ = ["compare", "live", "page", "render", "startup", "tables"]
