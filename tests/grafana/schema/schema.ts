// Grafana's own schema for what grafana/dashboard.py generates, for tsc --strict
// (tests/grafana/test_dashboard_schema.py).
//
// The test writes the dashboard as object literals typed with these, so TypeScript's excess
// property check reports any key Grafana does not know, at every depth; importing the JSON
// would check nothing of the kind. `Dashboard` types the whole model (variables, panels,
// targets' datasource, field config); a panel's `options` and `fieldConfig.defaults.custom`
// are a plugin's own, which `Dashboard` leaves open (`Record<string, unknown>`), so each
// panel's are checked once more against its plugin's types here.

import type * as table from '@grafana/schema/dist/esm/raw/composable/table/panelcfg/x/TablePanelCfg_types.gen';
import type * as timeseries from '@grafana/schema/dist/esm/raw/composable/timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen';

export type { Dashboard } from '@grafana/schema';

/**
 * What JSON may say of T: a string enum as its values (JSON has no enum members), every key
 * optional (Grafana fills a plugin's defaults in), and no key T does not have.
 */
export type JsonOf<T> = T extends string
  ? `${T}`
  : T extends ReadonlyArray<infer U>
    ? Array<JsonOf<U>>
    : T extends object
      ? { [K in keyof T]?: JsonOf<T[K]> }
      : T;

/** Each panel type the dashboard uses: its plugin's options and custom field config. */
export interface Plugins {
  table: { options: JsonOf<table.Options>; custom: JsonOf<table.FieldConfig> };
  timeseries: { options: JsonOf<timeseries.Options>; custom: JsonOf<timeseries.FieldConfig> };
}
