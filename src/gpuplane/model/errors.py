"""The one error type that bad input produces.

Every problem found while reading or validating cluster state is reported as an
:class:`InputError` naming the file, the document index, the object and the field
path, so that the command line can print exactly one clear line and exit 2.
"""

from __future__ import annotations


class InputError(Exception):
    """A problem with user-supplied cluster state.

    ``source`` is the file name (or ``<stdin>``), ``document`` the zero-based index of
    the YAML/JSON document inside it (``None`` when the problem is with the file as a
    whole), ``obj`` a ``Kind/namespace/name`` label (``None`` if unknown) and ``field``
    a dotted field path such as ``spec.resourceGroups[0].flavors[1].name``.

    ``invalid_value`` marks a well-formed object with a value Kueue cannot use (a negative
    request, ``minCount`` above ``count``, an unknown priority class), as opposed to input that
    is not Kubernetes at all (broken YAML, an unknown kind, a wrong type). Such a Workload is
    kept and reported as ``Misconfigured``; it does not stop the rest of the input.
    """

    def __init__(  # noqa: PLR0913  the message, then where it was found: keyword-only, all optional
        self,
        message: str,
        *,
        source: str | None = None,
        document: int | None = None,
        obj: str | None = None,
        field: str | None = None,
        invalid_value: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.document = document
        self.obj = obj
        self.field = field
        self.invalid_value = invalid_value

    def located(
        self,
        *,
        source: str | None = None,
        document: int | None = None,
        obj: str | None = None,
    ) -> InputError:
        """Return a copy with missing location parts filled in (existing parts win)."""
        return InputError(
            self.message,
            source=self.source if self.source is not None else source,
            document=self.document if self.document is not None else document,
            obj=self.obj if self.obj is not None else obj,
            field=self.field,
            invalid_value=self.invalid_value,
        )

    def __str__(self) -> str:
        parts: list[str] = []
        if self.source is not None:
            parts.append(self.source)
        if self.document is not None:
            parts.append(f"document {self.document}")
        if self.obj is not None:
            parts.append(self.obj)
        if self.field:
            parts.append(self.field)
        where = ": ".join(parts)
        text = f"{where}: {self.message}" if where else self.message
        # Names and values from the input may hold line breaks; the command line promises one line.
        return "\\n".join(text.splitlines())
