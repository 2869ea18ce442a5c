/* The schedule form: show only the chosen trigger kind's field, make the job and time zone
 * searchable, and keep the trigger preview up to date as the user types. No framework: the
 * admin's own jQuery is used only for select2, which the admin bundles. */
'use strict';
{
    // Each trigger kind's field, as in django_periodic.models.KIND_FIELDS; the others are hidden.
    const KIND_FIELDS = {cron: 'cron', interval: 'interval', once: 'run_at', rrule: 'rrule', after: 'after'};
    // Fields that matter to one trigger kind only, besides its own.
    const KIND_OPTIONS = {after_outcome: 'after', after_wait: 'after'};
    // Inputs whose value changes the preview (split datetimes are name_0 and name_1).
    const PREVIEWED = /^(trigger_kind|cron|timezone|dst_gap|dst_repeat|interval|run_at|rrule|after|start_at|end_at|enabled|calendars|on_closed_day)(_\d)?$/;
    // Policy fields that matter under one overlap policy only.
    const OVERLAP_FIELDS = {max_queued: 'queue', max_concurrent: 'concurrent'};
    // Fields whose errors the preview reports, shown on the field as the form would on save.
    const CHECKED = [
        'trigger_kind', 'cron', 'timezone', 'dst_gap', 'dst_repeat', 'interval', 'run_at', 'rrule', 'start_at',
        'end_at',
    ];
    const DEBOUNCE_MS = 250;

    function row(form, name) {
        return form.querySelector('.form-row.field-' + name);
    }

    function showKind(form, kind) {
        for (const [other, name] of Object.entries(KIND_FIELDS)) {
            const element = row(form, name);
            if (element) {
                element.style.display = other === kind ? '' : 'none';
            }
        }
        for (const [name, of] of Object.entries(KIND_OPTIONS)) {
            const element = row(form, name);
            if (element) {
                element.style.display = of === kind ? '' : 'none';
            }
        }
    }

    function showOverlapFields(form) {
        const overlap = form.querySelector('select[name="overlap"]');
        if (!overlap) {
            return;  // read-only: every stored value is shown
        }
        const update = () => {
            for (const [name, policy] of Object.entries(OVERLAP_FIELDS)) {
                const element = row(form, name);
                if (element) {
                    element.style.display = overlap.value === policy ? '' : 'none';
                }
            }
        };
        overlap.addEventListener('change', update);
        update();
    }

    function chosenKind(form) {
        const checked = form.querySelector('input[name="trigger_kind"]:checked');
        return checked ? checked.value : null;
    }

    function showFieldErrors(form, errors) {
        for (const name of CHECKED) {
            const element = row(form, name);
            if (!element) {
                continue;
            }
            const previous = element.querySelector('ul.errorlist');
            const messages = errors[name] || [];
            if (!messages.length) {
                if (previous) {
                    previous.remove();
                }
                element.classList.remove('errors');
                element.querySelectorAll('.errors').forEach((e) => e.classList.remove('errors'));
                continue;
            }
            const list = document.createElement('ul');
            list.className = 'errorlist';
            list.id = 'id_' + name + '_error';
            for (const message of messages) {
                const item = document.createElement('li');
                item.textContent = message;
                list.append(item);
            }
            if (previous) {
                previous.replaceWith(list);
            } else {
                element.prepend(list);
            }
            element.classList.add('errors');
        }
    }

    function makeSearchable(form) {
        const $ = window.django && window.django.jQuery;
        if (!$ || !$.fn.select2) {
            return;
        }
        $(form).find('select.periodic-searchable').select2({width: '30em'});
    }

    function livePreview(form, container) {
        let timer = null;
        let controller = null;

        async function refresh() {
            if (controller) {
                controller.abort();
            }
            controller = new AbortController();
            try {
                // POSTed with the form's CSRF token: what is typed (the job's arguments may
                // hold secrets) never goes into a URL, nor into logs or the history.
                const response = await fetch(container.dataset.url, {
                    method: 'POST',
                    body: new URLSearchParams(new FormData(form)),
                    signal: controller.signal,
                    headers: {Accept: 'application/json'},
                    credentials: 'same-origin',
                });
                if (!response.ok) {
                    throw new Error('preview: HTTP ' + response.status);
                }
                const payload = await response.json();
                container.innerHTML = payload.html;
                showFieldErrors(form, payload.errors);
                container.classList.remove('periodic-stale');
            } catch (error) {
                if (error.name !== 'AbortError') {
                    container.classList.add('periodic-stale');
                }
            }
        }

        function schedule(event) {
            if (event.target && PREVIEWED.test(event.target.name || '')) {
                clearTimeout(timer);
                timer = setTimeout(refresh, DEBOUNCE_MS);
            }
        }

        form.addEventListener('input', schedule);
        form.addEventListener('change', schedule);
        const $ = window.django && window.django.jQuery;
        if ($) {
            // select2 announces a choice with a jQuery event, which native listeners miss.
            $(form).on('select2:select', 'select', schedule);
        }
    }

    function init() {
        const form = document.getElementById('schedule_form');
        if (!form) {
            return;
        }
        const kind = chosenKind(form);
        if (kind) {
            showKind(form, kind);
            form.addEventListener('change', (event) => {
                if (event.target.name === 'trigger_kind') {
                    showKind(form, event.target.value);
                }
            });
        }
        showOverlapFields(form);
        makeSearchable(form);
        const container = document.getElementById('periodic-preview');
        if (container && container.dataset.url && kind) {
            livePreview(form, container);
        }
    }

    if (document.readyState === 'loading') {
        document.addEventListener('DOMContentLoaded', init);
    } else {
        init();
    }
}
