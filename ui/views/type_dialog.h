// A form for a new device type or link type, opened from the mesh canvas' "New device type..." and "New link
// type..." menu entries.
//
// What always holds: the dialog only closes with Accepted when its entry, added to a copy of the mesh it was
// given, passes addDeviceType() or addLinkType() (ui/models/mesh_model.h); otherwise it stays open and shows
// the reason. It never changes the mesh itself: the caller applies deviceType() or linkType().
#pragma once

#include <QDialog>

#include "plan/run_config.h"

class QCheckBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;

namespace ms {

// A form for a new device type or link type; it checks the entry against the mesh before closing.
class TypeDialog : public QDialog {
 public:
  TypeDialog(const MeshConfig& mesh, bool device, QWidget* parent);
  DeviceTypeConfig deviceType() const;  // only for a device dialog
  LinkTypeConfig linkType() const;

 private:
  MeshConfig m_mesh;
  bool m_device;
  QLineEdit* m_name = nullptr;
  QLineEdit* m_label = nullptr;
  QDoubleSpinBox *m_a = nullptr, *m_b = nullptr, *m_c = nullptr, *m_d = nullptr;
  QCheckBox* m_perDevice = nullptr;  // only for a link dialog
  QLabel* m_error = nullptr;
};

}  // namespace ms
